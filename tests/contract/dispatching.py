"""The real dispatcher's pass (dtask/worker/dispatcher.py ``Dispatcher._pass``) over a world's
store: live workers as a test declares them, what it would publish recorded instead, and
workers taking what was sent. Each pass starts without a measured pace (that is the real
workers' speed, which there is none of here), so a queue's window is two children per live
slot and the order children leave in is the store's and ``plan``'s alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from dtask import services
from dtask.db import Claim
from dtask.db.recovery import Redispatch
from dtask.domain.dispatch import Passes
from dtask.settings import Settings
from dtask.worker import dispatcher
from dtask.worker.messages import RESEND, Sender
from tests.contract.worlds import World


class NoBroker(Sender):
    @property
    def producer(self) -> Any:
        return None


@dataclass(frozen=True)
class Published:
    run_id: int
    index: int
    level: int  # the broker priority it went at
    message: int  # children in its message (one: no run here has measured times)


@dataclass
class Dispatching:
    world: World
    settings: Settings = field(default_factory=lambda: Settings(lease_ttl=8.0))
    passes: dict[str, Passes] = field(default_factory=dict)
    reported: list[str] = field(default_factory=list)  # the workers it declared live
    sent: list[Published] = field(default_factory=list)
    worked: int = 0  # of ``sent``, how many a worker has taken
    running: list[tuple[int, Claim]] = field(default_factory=list)  # (run, claim) held

    def worker(self, *queues: str, slots: int = 1, templates: Iterable[str] | None = None) -> None:
        """A live worker of ``queues`` with ``slots`` pool processes, that can run
        ``templates`` (None: it did not say)."""
        name = f"w{uuid.uuid4().hex[:12]}@contract"
        self.world.workers.report(name, queues, slots, 0, 0, templates)
        self.reported.append(name)

    def once(self) -> list[tuple[int, int]]:
        """One pass: the children it sent, (run, index), in the order they left."""
        store = SimpleNamespace(dispatch=self.world.dispatch, workers=self.world.workers)
        resolved = services.Services(self.settings, "memory://", "memory://", "memory://")
        published: list[Published] = []

        def send(
            messages: Iterable[list[Redispatch]],
            priority: int = RESEND,
            through: Any = None,
            countdown: float | None = None,
        ) -> int:
            out = [Published(c.run_id, c.index, priority, len(m)) for m in messages for c in m]
            published.extend(out)
            return len(out)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(services, "store", lambda: store)
            patch.setattr(services, "current", lambda: resolved)
            patch.setattr(dispatcher, "send", send)
            done = dispatcher.Dispatcher(passes=self.passes)._pass(NoBroker(), wait=10)
        assert done is not None, "another pass held the dispatcher's turn for 10 s"
        self.sent.extend(published)
        return [(p.run_id, p.index) for p in published]

    def work(self, count: int | None = None, finish: bool = True) -> None:
        """Workers take the next ``count`` children sent (all by default) and, with
        ``finish``, run them to success; otherwise they hold them running."""
        end = len(self.sent) if count is None else self.worked + count
        for p in self.sent[self.worked : end]:
            claim = self.world.claim(p.run_id, p.index, "worker")
            if finish:
                self.world.children.finish(claim, None)
            else:
                self.running.append((p.run_id, claim))
        self.worked = min(end, len(self.sent))

    def finish_one(self, run_id: int) -> None:
        """One of the run's children held running ends."""
        held = next(h for h in self.running if h[0] == run_id)
        self.running.remove(held)
        self.world.children.finish(held[1], None)

    def until_done(self, passes: int = 100) -> list[list[tuple[int, int]]]:
        """Passes, each followed by workers finishing what it sent, until one sends nothing."""
        rounds: list[list[tuple[int, int]]] = []
        for _ in range(passes):
            sent = self.once()
            if not sent:
                return rounds
            rounds.append(sent)
            self.work()
        raise AssertionError(f"still sending after {passes} passes")
