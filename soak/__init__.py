"""`make soak`: a chaos soak of dtask (issue 15). Random faults at random times against a live
cluster of real `dtask worker` and `dtask beat` processes while runs, a schedule, cancels and
reruns keep arriving; then invariants checked and printed as a table.

Not part of the `dtask` package (like `bench/`): `python -m soak.run --minutes 10 --seed 1`.
"""
