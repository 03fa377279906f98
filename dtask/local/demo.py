"""`make demo`: the sample job end to end on the embedded services, a worker killed mid-run.

Starts the embedded PostgreSQL and Redis, two workers and Flower; submits print_range; shows
progress; SIGKILLs the worker running a child about a third of the way in; shows that child
resuming from its checkpoint on the other worker; checks every number was printed; prints a
summary; stops everything.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dtask import services
from dtask.domain.runs import RunState, RunStatus
from dtask.exceptions import DtaskError
from dtask.local.stack import Child, Stack, flower_login
from dtask.progress import Progress
from dtask.settings import load

CHUNK = 1000  # print_range's children each print this many numbers
_PRINTED = re.compile(rb"\] (\d+)\n")


def say(line: str) -> None:
    print(f"demo: {line}", flush=True)


def running_child(run_id: int) -> tuple[int, int, int] | None:
    """(index, owner pid, items done) of a running child with progress, if any."""
    child = services.store().children.first_checkpointed_running(run_id)
    if child is None or child.owner is None:
        return None
    return child.index, int(child.owner.rsplit(":", 1)[1]), int(child.checkpoint["done"])


def child_attempt(run_id: int, index: int) -> tuple[str, int, str | None]:
    child = services.store().children.view(run_id, index)
    assert child is not None
    return child.state.value, child.attempt, child.owner


class Chaos:
    """Kills the worker running a child once the run is ``at`` done, then reports the resume."""

    def __init__(self, stack: Stack, at: float) -> None:
        self.stack = stack
        self.at = at
        self.victim: tuple[int, int, float] | None = None  # child index, items done, kill time
        self.resumed = False

    def __call__(self, status: RunStatus) -> None:
        c = status.children
        if self.victim is None and c.total and c.finished >= self.at * c.total:
            self._kill(status.id)
        elif self.victim is not None and not self.resumed:
            index, done, killed_at = self.victim
            state, attempt, owner = child_attempt(status.id, index)
            if attempt > 1 or state == "succeeded":
                self.resumed = True
                where = f" on process {owner}" if owner else ""
                say(
                    f"child {index} resumed{where} {time.monotonic() - killed_at:.1f} s after the"
                    f" kill, from its checkpoint at {done}/{CHUNK} numbers"
                )
                workers = [c for c in self.stack.children if c.name.startswith("worker")]
                joined = self.stack.start_worker(len(workers) + 1)
                say(f"{joined.name} joins to replace the killed worker")

    def _kill(self, run_id: int) -> None:
        found = running_child(run_id)
        if found is None:
            return
        index, pid, done = found
        worker = next(
            (c for c in self.stack.children if c.name.startswith("worker") and _owns(c, pid)), None
        )
        if worker is None:
            return
        self.stack.kill(worker)
        self.victim = (index, done, time.monotonic())
        say(f"SIGKILL {worker.name} while it ran child {index} ({done}/{CHUNK} checkpointed)")


def _owns(child: Child, pid: int) -> bool:
    try:
        return os.getpgid(pid) == child.proc.pid
    except ProcessLookupError:
        return False


def printed_numbers(logs: list[Path]) -> tuple[int, int]:
    """(distinct numbers, total lines) the children printed into the worker logs."""
    seen: set[int] = set()
    total = 0
    for log in logs:
        for match in _PRINTED.finditer(log.read_bytes()):
            seen.add(int(match.group(1)))
            total += 1
    return len(seen), total


def both(*callbacks: Callable[[RunStatus], None]) -> Callable[[RunStatus], None]:
    def call(status: RunStatus) -> None:
        for callback in callbacks:
            callback(status)

    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("-n", type=int, default=2_000_000, help="print 1..n (default 2,000,000)")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    args = parser.parse_args(argv)

    # A child prints its 1,000 numbers in milliseconds: checkpoint every 100 so that the
    # killed child has a checkpoint to resume from (the workers inherit this).
    os.environ.setdefault("DTASK_CHECKPOINT_EVERY", "100")
    stack = Stack(workers=2, concurrency=1, flower=True, beat=False)
    try:
        say("starting embedded PostgreSQL and Redis, 2 workers and Flower...")
        stack.start()
        stack.wait_ready()
        for line in stack.describe():
            say(line)

        from dtask.client.runs import submit

        began = time.monotonic()
        run = submit("print_range", {"n": args.n})
        say(f"submitted run {run.id}: print_range n={args.n:,} ({-(-args.n // CHUNK)} children)")
        chaos = Chaos(stack, at=0.0 if args.no_kill else 0.35)
        progress = Progress(sys.stdout, items_per_child=CHUNK, plain_every=3)
        watch = progress if args.no_kill else both(progress, chaos)
        status = run.wait(timeout=600, on_progress=watch)
        wall = time.monotonic() - began
        time.sleep(0.5)  # the last log lines
        distinct, lines = printed_numbers(
            [c.log for c in stack.children if c.name.startswith("worker")]
        )
        c = status.children
        print(f"run {status.id}: {status.state.value}")
        print(f"  children   {c.succeeded} succeeded, {c.failed} failed of {c.total}")
        print(f"  wall time  {wall:.1f} s ({args.n / wall:,.0f} numbers/s)")
        print(f"  printed    {distinct:,} distinct numbers of {args.n:,}", end="")
        print(
            f" ({lines - distinct:,} twice: work redone after the kill)" if lines > distinct else ""
        )
        if stack.flower:
            login = flower_login(load().home)
            print(f"  flower     {stack.flower_url} ({login}; stops with the demo)")
        if status.error:
            print(f"  error      {status.error}")
        ok = status.state is RunState.SUCCEEDED and distinct == args.n
        return 0 if ok else 1
    except DtaskError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    finally:
        say("stopping workers, Flower, PostgreSQL and Redis")
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
