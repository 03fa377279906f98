"""How a bulk submit's masters go to messages (dtask.worker.masters._messages)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtask.worker.masters import Master, _messages
from dtask.worker.task_table import MASTER, MASTERS


def master(run_id: int, template: str = "t", priority: int = 5, countdown: float = 0.0) -> Master:
    return Master(run_id, template, priority, countdown, f"{template} run {run_id}")


def test_runs_of_one_template_and_priority_go_per_message_to_a_masters_message() -> None:
    found = list(_messages([master(i) for i in range(120)], 50))
    assert [(name, len(args[2])) for name, args, *_ in found] == [(MASTERS, 50)] * 2 + [
        (MASTERS, 20)
    ]
    assert found[0][1][:2] == ("t", 5)
    assert found[0][2] == "t runs 0..49 (50)"


def test_a_countdown_a_lone_run_and_one_per_message_go_as_masters_of_their_own() -> None:
    masters = [master(1, countdown=30.0), master(2), master(3, template="u"), master(4, "u")]
    found = list(_messages(masters, 50))
    assert [(name, args) for name, args, *_ in found] == [
        (MASTER, (1,)), (MASTER, (2,)), (MASTERS, ("u", 5, [3, 4])),
    ]  # fmt: skip
    assert found[0][4] == 30.0
    assert {name for name, *_ in _messages([master(i) for i in range(5)], 1)} == {MASTER}


@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from([2, 5, 8]), st.booleans()), max_size=60
    ),
    st.integers(1, 7),
)
def test_every_run_is_sent_once_in_order_in_groups_alike_and_bounded(
    kinds: list[tuple[str, int, bool]], per_message: int
) -> None:
    masters = [
        master(i, template, priority, 5.0 if later else 0.0)
        for i, (template, priority, later) in enumerate(kinds)
    ]
    by_id = {m.run_id: m for m in masters}
    sent: list[int] = []
    for name, args, _, priority, countdown, _ in _messages(masters, per_message):
        ids = [args[0]] if name == MASTER else args[2]
        assert name == MASTER or (1 < len(ids) <= per_message and countdown == 0.0)
        assert {(by_id[i].template, by_id[i].priority) for i in ids} == {
            (by_id[ids[0]].template, priority)
        }
        sent += ids
    assert sent == [m.run_id for m in masters]
