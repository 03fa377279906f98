"""Completion notifications against real PostgreSQL and real receivers on 127.0.0.1 (issue 35):
a receiver that trickles its answer holds one try for one deadline and holds back no one else's,
a private target is refused unless DTASK_NOTIFY_ALLOW_PRIVATE allows it, and a worker whose
hold on a delivery passed to another writes nothing."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Store
from dtask.domain.runs import NewRun
from dtask.worker import notifier
from dtask.worker.loop import Loop
from tests.support.db import wait_for
from tests.support.receivers import Plain, Trickler

DEADLINE = 6.0  # the notifier's, for these tests (10 s by default)


class Notify(NamedTuple):
    state: str
    attempts: int
    error: str | None


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    """The store; runs made by :func:`finished_run` are settled afterwards, so no later pass
    (here or in another test) tries them again."""
    made.clear()
    yield services.store()
    with services.store().engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE dtask_runs SET notify_state = 'failed', notify_next_at = NULL"
                " WHERE id = ANY(:ids) AND notify_state = 'waiting'"
            ),
            {"ids": list(made)},
        )


made: list[int] = []


def finished_run(store: Store, url: str, due_in: float = 0.0) -> int:
    """A run that succeeded just now, its notification due in ``due_in`` seconds."""
    run_id, created = store.runs.create(
        NewRun("t", f"notify:{uuid.uuid4()}", {}, 1, None, notify_url=url)
    )
    assert created
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE dtask_runs SET state = 'succeeded', finished_at = now(),"
                " notify_next_at = now() + make_interval(secs => :due) WHERE id = :id"
            ),
            {"id": run_id, "due": due_in},
        )
    made.append(run_id)
    return run_id


def notify(run_id: int) -> Notify:
    with services.store().engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT notify_state, notify_attempts, notify_error FROM dtask_runs WHERE id = :id"
            ),
            {"id": run_id},
        ).one()
    return Notify(row.notify_state, row.notify_attempts, row.notify_error)


@pytest.fixture
def notifier_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The worker's notifier loop in this process, its deadline shortened to DEADLINE."""
    monkeypatch.setattr(notifier, "DEADLINE", DEADLINE, raising=False)
    loop = Loop("notifier", 0.1, notifier.once)
    loop.start()
    try:
        yield
    finally:
        loop.stop()


def test_a_trickling_receiver_holds_one_try_for_one_deadline_and_no_one_else(
    store: Store, notifier_loop: None
) -> None:
    with Trickler(every=2.0) as trickler, Plain() as good:
        slow = finished_run(store, trickler.url)
        first = wait_for(lambda: trickler.connections, 10, "the trickler's first try")[0]
        # Due only now, while the trickler is holding its try: the notifier must not wait for it.
        fast = finished_run(store, good.url)
        wait_for(lambda: good.got, 4, "the good receiver's notification, beside the trickler")
        assert first.closed is None, "the trickler's try should still be under way"
        wait_for(lambda: notify(fast).state == "delivered", 10, "the good delivery recorded")

        wait_for(lambda: first.closed is not None, DEADLINE + 10, "the trickler's try to end")
        assert first.closed is not None
        assert first.closed - first.accepted < DEADLINE + 2  # the deadline, and a little slack
        assert first.sent > 29  # it did trickle: every read got a byte within 2 s
        failed = wait_for(lambda: notify(slow).error, 10, "the failed try recorded")
        assert failed == f"no complete answer within the {DEADLINE:g} s deadline"
        assert notify(slow).state == "waiting"  # tried again on its schedule


def test_a_private_target_is_refused_unless_the_setting_allows_it(
    store: Store, notifier_loop: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert services.current().settings.notify_allow_private  # tests/conftest.py's dtask_env
    here = services.current()
    strict = here.settings.model_copy(update={"notify_allow_private": False})
    monkeypatch.setattr(services, "_current", dataclasses.replace(here, settings=strict))
    with Plain() as receiver:
        run_id = finished_run(store, receiver.url)
        error = wait_for(lambda: notify(run_id).error, 10, "the refused try")
        assert error == "refused: 127.0.0.1 is a loopback address (DTASK_NOTIFY_ALLOW_PRIVATE)"
        assert notify(run_id).state == "waiting" and receiver.connections == []

        monkeypatch.setattr(services, "_current", here)  # the setting on: tried again, taken
        wait_for(lambda: notify(run_id).state == "delivered", 15, "the delivery once allowed")
        assert len(receiver.got) == 1 and notify(run_id).attempts == 2


def test_a_holder_whose_hold_was_retaken_writes_nothing(store: Store) -> None:
    run_id = finished_run(store, "http://127.0.0.1:9/never")

    def take() -> Any:
        (item,) = [d for d in store.notify.due(100, hold=60) if d.run_id == run_id]
        return item

    stale = take()
    with store.engine.begin() as conn:  # its hold runs out (a worker frozen past it)
        conn.execute(
            text("UPDATE dtask_runs SET notify_next_at = now() - interval '1 s' WHERE id = :id"),
            {"id": run_id},
        )
    holder = take()
    assert holder.held != stale.held

    assert store.notify.delivered(stale) is False
    assert store.notify.failed(stale, "late", 1.0) is False
    assert notify(run_id) == Notify("waiting", 0, None)  # the stale holder wrote nothing

    assert store.notify.failed(holder, "HTTP 500", 1.0) is True
    assert notify(run_id) == Notify("waiting", 1, "HTTP 500")
    assert store.notify.delivered(holder) is False  # its hold ended with its failed try
