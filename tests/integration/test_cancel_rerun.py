"""Cancel then rerun while the cancelled child's old owner is still running it (issue 15,
hole 10): the rerun's message for that child is dropped as a duplicate (the old owner still
holds the lease), so the old owner must hand the child over when it lets go of it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.exceptions import Ignore

import dtask
from dtask import services
from dtask.db import Claim, Refusal, Store
from dtask.domain.runs import ClaimRefusal, NewRun, RunState
from dtask.domain.templates import Template, registry
from dtask.worker import configure
from dtask.worker.app import app
from dtask.worker.attempt import Attempt
from dtask.worker.tasks import OwnMessage, child
from tests.support.db import child_row, wait_for

TEMPLATE = "cancelled_then_rerun_while_running"


def _cancel_then_rerun_while_running(ctx: dtask.ChildContext, a: int, b: int) -> None:
    store = services.store()
    store.runs.cancel(ctx.run_id)
    wait_for(ctx.should_stop, 30, "the heartbeat to see the cancel")
    assert store.runs.rerun(ctx.run_id) is RunState.SPLITTING
    store.runs.dispatch(ctx.run_id, lambda run, todo: None)  # its messages: the claim below
    # A worker takes the rerun's message for this child: the old owner (us) holds the lease.
    duplicate = store.children.claim(ctx.run_id, ctx.index, "another:2", 30)
    assert isinstance(duplicate, Refusal) and duplicate.reason is ClaimRefusal.BUSY
    ctx.checkpoint({"done": 1})  # raises ChildStopped: the cancel's stop flag is still up


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    configure()
    if TEMPLATE not in registry:
        registry.add(
            Template(
                name=TEMPLATE,
                params={},
                skeleton={},
                split=lambda rendered: [{"a": 1, "b": 2}],
                function=_cancel_then_rerun_while_running,
            )
        )
    yield services.store()


def queued_child_ids(remove: str | None = None) -> set[str]:
    """Task ids of the child messages waiting in the broker (read, not consumed); the
    message with the id ``remove`` is taken out."""
    found: set[str] = set()
    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        for key in client.keys("dtask*"):
            if client.type(key) != b"list":
                continue
            for raw in client.lrange(key, 0, -1):
                headers: dict[str, Any] = json.loads(raw)["headers"]
                if headers.get("task") == "dtask.child":
                    found.add(headers["id"])
                    if headers["id"] == remove:
                        client.lrem(key, 0, raw)
    return found


def test_the_old_owner_hands_a_rerun_child_over_when_it_lets_go(store: Store) -> None:
    run_id, _ = store.runs.create(NewRun(TEMPLATE, f"test:{uuid.uuid4()}", {}, 3, None))
    store.runs.split(run_id, lambda run, slots: [{"a": 1, "b": 2}])
    store.runs.dispatch(run_id, lambda run, todo: None)
    claim = store.children.claim(run_id, 0, "old-owner:1", 30)
    assert isinstance(claim, Claim)

    with pytest.raises(Ignore):
        spec = {"a": 1, "b": 2}
        own = OwnMessage(child, run_id, 0, TEMPLATE, spec)
        Attempt(own, own.children[0], claim, services.current().settings, time.monotonic()).run()

    run = store.runs.get(run_id)
    assert run.state is RunState.RUNNING and run.group_id == f"dtask-{run_id}-2"
    row = child_row(run_id, 0)
    assert (row.state, row.owner, row.checkpoint) == ("pending", None, {"done": 1})
    # Without a hand-over nothing would ever send this child again (only the lost-message
    # path of the reaper, after the stall timeout, with an empty queue).
    assert f"dtask-{run_id}-2.0" in queued_child_ids(remove=f"dtask-{run_id}-2.0")
    # Leave nothing for the workers of later tests: they do not know this template.
    store.runs.cancel(run_id)
