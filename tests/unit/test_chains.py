"""dtask.worker.chains without services: the submit task takes the rest of its chain over and
clears it on its request; the kept chain is sent with the run's result, or failed with the
run's error (the later steps' results fail, errbacks get the error), once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery, chain

from dtask.db.runs import Chained, RunRecord
from dtask.domain.runs import RunState
from dtask.exceptions import RunCancelled, RunFailed
from dtask.worker import chains


class FakeRuns:
    """``RunStore``'s chain methods over one run: its state, result, error and chains."""

    def __init__(self, state: RunState = RunState.RUNNING) -> None:
        self.state, self.result, self.error = state, None, None
        self.chains: list[dict[str, Any]] | None = None

    def get(self, run_id: int) -> Any:
        return RunRecord(
            run_id, "t", "k", {}, self.state, 1, None, 1, None, None, 0,
            chained=self.chains is not None,
        )  # fmt: skip

    def add_chain(self, run_id: int, chain: dict[str, Any]) -> RunState:
        self.chains = [*(self.chains or []), chain]
        return self.state

    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool:
        if self.chains is None or not self.state.finished:
            return False
        send(Chained(run_id, self.state, self.result, self.error, self.chains))
        self.chains = None
        return True

    def chained_finished(self, settled_for: float, limit: int = 100) -> list[int]:
        return [7] if self.chains is not None and self.state.finished else []


class FakeStore:
    def __init__(self, runs: FakeRuns) -> None:
        self.runs = runs


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Celery, list[Any]]]:
    """A Celery app with an in-memory result backend; ``got`` records each message sent
    (task, args, the chain it carries) and each errback called in this process."""
    app = Celery("chains-test", set_as_current=False)
    app.conf.update(result_backend="cache+memory://", broker_url="memory://")
    got: list[Any] = []

    def send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        rest = [step["task"] for step in options.get("chain") or []]
        got.append((name, tuple(args or ()), rest, options.get("parent_id")))
        return app.AsyncResult(options.get("task_id") or "sent")

    monkeypatch.setattr(app, "send_task", send_task)

    @app.task(name="t.record", shared=False)
    def record(value: Any) -> Any:
        got.append(("record", value))
        return value

    @app.task(name="t.then", shared=False)
    def then(value: Any) -> Any:
        got.append(("then", value))
        return value

    @app.task(name="t.errback", shared=False)
    def errback(request: Any, exc: BaseException, traceback: Any) -> None:
        got.append(("errback", request.id, type(exc).__name__, str(exc)))

    monkeypatch.setattr(chains, "current", lambda: app)
    yield app, got


class Request:
    def __init__(self, **fields: Any) -> None:
        self.id, self.root_id = "submit-1", "root-1"
        self.chain = self.callbacks = self.errbacks = None
        self.__dict__.update(fields)


class Task:
    def __init__(self, request: Request) -> None:
        self.request = request


def test_outside_a_chain_nothing_is_taken() -> None:
    runs = FakeRuns()
    chains.take_over(Task(Request()), FakeStore(runs), 7)  # type: ignore[arg-type]
    assert runs.chains is None


def test_the_rest_of_the_chain_waits_for_the_run_and_gets_its_result(
    app: tuple[Celery, list[Any]],
) -> None:
    celery, got = app
    steps = chain(celery.signature("t.record"), celery.signature("t.then"))
    rest = list(reversed([dict(s) for s in steps.tasks]))  # as request.chain holds it
    request = Request(chain=rest, callbacks=[dict(celery.signature("t.then"))])
    runs = FakeRuns()
    chains.take_over(Task(request), FakeStore(runs), 7)  # type: ignore[arg-type]
    assert (request.chain, request.callbacks, request.errbacks) == (None, None, None)
    assert runs.chains is not None and runs.chains[0]["id"] == "submit-1"
    assert chains.continue_chains(FakeStore(runs), 7) is False  # not finished: nothing yet
    assert got == []
    runs.state, runs.result = RunState.SUCCEEDED, 55
    assert chains.continue_chains(FakeStore(runs), 7) is True
    assert got == [
        ("t.then", (55,), [], "submit-1"),  # the link callback
        ("t.record", (55,), ["t.then"], "submit-1"),  # the chain's next step, the rest with it
    ]
    assert chains.continue_chains(FakeStore(runs), 7) is False  # once
    assert len(got) == 2


@pytest.mark.parametrize(
    ("state", "error", "expected"),
    [
        (RunState.FAILED, RunFailed, "run 7 failed: 1 child task(s) failed: child 0: boom"),
        (RunState.CANCELLED, RunCancelled, "run 7 was cancelled"),
    ],
)
def test_a_run_that_fails_fails_its_chain_with_its_error(
    app: tuple[Celery, list[Any]], state: RunState, error: type[Exception], expected: str
) -> None:
    celery, got = app
    last = celery.signature("t.then").set(task_id="last-step")
    request = Request(chain=[dict(last)], errbacks=[dict(celery.signature("t.errback"))])
    runs = FakeRuns()
    chains.take_over(Task(request), FakeStore(runs), 7)  # type: ignore[arg-type]
    runs.state, runs.error = state, "1 child task(s) failed: child 0: boom"
    chains.continue_chains(FakeStore(runs), 7)
    assert got == [("errback", "submit-1", error.__name__, expected)]
    stored = celery.AsyncResult("last-step")
    assert stored.state == "FAILURE" and str(stored.result) == expected


def test_a_run_finished_before_its_chain_arrived_sends_it_at_once(
    app: tuple[Celery, list[Any]],
) -> None:
    celery, got = app
    runs = FakeRuns(RunState.SUCCEEDED)
    runs.result = {"rows": 3}
    request = Request(chain=[dict(celery.signature("t.record"))])
    chains.take_over(Task(request), FakeStore(runs), 7)  # type: ignore[arg-type]
    assert got == [("t.record", ({"rows": 3},), [], "submit-1")] and runs.chains is None
