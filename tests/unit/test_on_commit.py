"""``Template.delay_on_commit`` / ``apply_async_on_commit`` (Celery's names): the submit waits
for the caller's commit through the Launcher port, so the domain knows nothing of Django."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dtask
from dtask.domain import templates


class Recorder:
    """A Launcher that records submits and keeps on-commit callbacks until ``commit``."""

    def __init__(self) -> None:
        self.submits: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
        self.waiting: list[Callable[[], Any]] = []

    def submit(self, template: str, variables: dict[str, Any], **options: Any) -> Any:
        self.submits.append((template, variables, options))
        return None

    def on_commit(self, callback: Callable[[], Any]) -> None:
        self.waiting.append(callback)

    def commit(self) -> None:
        for callback in self.waiting:
            callback()
        self.waiting.clear()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def signature(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    installed = templates.launcher()
    fake = Recorder()
    templates.use_launcher(fake)  # type: ignore[arg-type]
    try:
        yield fake
    finally:
        templates.use_launcher(installed)


@dtask.template("on_commit_sample", params={"n": int}, skeleton={"n": "${n}"}, split=lambda r: [r])
def sample(ctx: dtask.ChildContext, n: int) -> None:
    pass


def test_delay_on_commit_submits_only_when_the_transaction_commits(recorder: Recorder) -> None:
    assert sample.delay_on_commit(n=3) is None  # as Celery's: the run does not exist yet
    assert recorder.submits == []
    recorder.commit()
    assert recorder.submits == [("on_commit_sample", {"n": 3}, {"key": None})]


def test_apply_async_on_commit_keeps_its_options_and_refuses_args_at_once(
    recorder: Recorder,
) -> None:
    sample.apply_async_on_commit(kwargs={"n": 4}, key="k", priority=7)
    assert recorder.submits == []
    recorder.commit()
    assert recorder.submits == [("on_commit_sample", {"n": 4}, {"key": "k", "priority": 7})]
    with pytest.raises(dtask.InvalidVariables):
        sample.apply_async_on_commit((4,))
    assert recorder.waiting == []


def test_without_django_the_installed_launcher_submits_at_once() -> None:
    """Celery's delay_on_commit sends at once outside a transaction; where Django is not set
    up there is no transaction to wait for."""
    ran: list[int] = []
    templates.launcher().on_commit(lambda: ran.append(1))
    assert ran == [1]
