"""A world for the contract suite: a store (the in-memory one, or the real one on the test
session's PostgreSQL) and what a test needs around it: a run split into children (sent with
its chord, or left to the dispatcher), clients, time passing for one child's lease, and a
run's state moved by hand (as a worker of an older dtask would leave it).

On PostgreSQL every test shares the session's database: a test names its own clients and
queues (``World.client``, ``World.queue``) and reads only its own runs."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import text

from dtask.db import ChildView, Claim, Finished, Refusal, RunRecord, Store, WorkerInfo
from dtask.db.dispatch import Out
from dtask.db.inline import Inline
from dtask.db.recovery import Redispatch
from dtask.db.run_reads import Graph
from dtask.db.runs import Chained, Reducer
from dtask.db.workers import LiveSlots
from dtask.domain.clients import Client
from dtask.domain.dispatch import Demand, Share
from dtask.domain.runs import ChildState, NewRun, RunState, RunStatus
from dtask.worker.child_store import ChildWrites
from tests.support.memory import MemoryStore
from tests.support.memory_runs import Send


class Children(ChildWrites, Protocol):
    """What the child lifecycle and the batch path ask of ``store.children``."""

    def claim(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal: ...
    def claim_many(
        self, run_id: int, indexes: list[int], owner: str, lease_ttl: float
    ) -> dict[int, Claim]: ...
    def start(self, claim: Claim, lease_ttl: float) -> Claim | None: ...
    def write_batch(
        self, done: list[Finished], claim: Claim | None, lease_ttl: float
    ) -> tuple[set[int], Claim | None]: ...
    def unclaim(self, claim: Claim) -> None: ...
    def revoke(self, run_id: int, index: int, error: str) -> bool: ...
    def view(self, run_id: int, index: int) -> ChildView | None: ...
    def note_time(self, run_id: int, seconds: float) -> bool: ...


class Runs(Protocol):
    def create(self, run: NewRun) -> tuple[int, bool]: ...
    def split(
        self,
        run_id: int,
        plan: Callable[[RunRecord, LiveSlots], Sequence[str | Mapping[str, Any]]],
        wait: bool = True,
        deferred: bool = False,
        offer: Inline | None = None,
    ) -> RunState: ...
    def rerun(self, run_id: int) -> RunState: ...
    def status(self, run_id: int) -> RunStatus: ...
    def ids_by_key(self, keys: Sequence[str], client: str = ...) -> dict[str, int]: ...
    def forget_unsent(self, run_id: int) -> bool: ...
    def graph(self, run_id: int) -> Graph: ...
    def finish_alone(
        self,
        run_id: int,
        done: Finished,
        chained: list[int] | None = None,
    ) -> list[int] | None: ...
    def get(self, run_id: int) -> RunRecord: ...
    def unsplit(self, run_ids: list[int]) -> list[int]: ...
    def dispatch(
        self, run_id: int, send: Send, wait: bool = True, deferred: bool = False
    ) -> RunState: ...
    def cancel(self, run_id: int) -> RunState: ...
    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool: ...
    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = ...,
    ) -> RunState: ...


class Pass(Protocol):
    """A dispatcher's turn (``dtask.db.dispatch.DispatchPass``)."""

    def demands(self, per_client: int | None = None) -> dict[str | None, list[Demand]]: ...
    def out(
        self, runnable: Callable[[str | None, str], bool] = ...
    ) -> tuple[dict[str | None, Out], dict[str, int]]: ...
    def shares(self, names: set[str], out: dict[str, int]) -> dict[str, Share]: ...
    def take(self, run_id: int, count: int, batch: int = ...) -> list[list[Redispatch]]: ...
    def live_workers(self, within: float) -> list[WorkerInfo]: ...


class Dispatch(Protocol):
    def turn(
        self, hold_for: float = ..., wait: float = ...
    ) -> AbstractContextManager[Pass | None]: ...


class Workers(Protocol):
    def report(
        self,
        name: str,
        queues: Sequence[str],
        slots: int,
        pid: int,
        busy: int,
        templates: Sequence[str] | None = None,
    ) -> None: ...
    def leave(self, name: str) -> None: ...
    def live(self, within: float) -> list[WorkerInfo]: ...


class Clients(Protocol):
    def save(self, client: Client) -> None: ...


class Recovery(Protocol):
    def settle_waiting(self, limit: int = ...) -> list[int]: ...
    def release_expired(self, limit: int = ..., lease_ttl: float = ...) -> list[Redispatch]: ...


# (children, max_attempts, execution cap) -> a run created and split, not dispatched
MakeRun = Callable[[int, int, float | None], int]
# (the children's specs, max_attempts) -> the same
MakeSpecs = Callable[[Sequence[Mapping[str, Any]], int], int]


@dataclass
class World:
    name: str
    children: Children
    runs: Runs
    make: MakeRun
    expire: Callable[[int, int], None]  # the child's lease has run out (time passed)
    dispatch: Dispatch
    clients: Clients
    recovery: Recovery
    workers: Workers
    force: Callable[[int, RunState], None]  # the run's state set, nothing settled
    output: Callable[[int, int], str | None]  # the last lines the child printed, as kept
    make_specs: MakeSpecs
    spec: Callable[[int, int], dict[str, Any]]  # the child's spec as stored (a range cut)
    sent: Callable[[int, int], bool]  # the child's own row says it was sent (its sent_at)

    def client(self, **limits: Any) -> str:
        """A new client of this test's own (``Client``'s settings as keywords)."""
        name = f"c-{uuid.uuid4().hex[:12]}"
        self.clients.save(Client(name, **limits))
        return name

    @staticmethod
    def queue() -> str:
        """A queue of this test's own."""
        return f"q-{uuid.uuid4().hex[:12]}"

    def submit(self, template: str = "t", **options: Any) -> int:
        """A run created from a ``NewRun`` (its options as keywords; a new key unless given)."""
        key = options.pop("key", None) or f"contract:{uuid.uuid4()}"
        max_attempts = options.pop("max_attempts", 2)
        queue = options.pop("queue", None)
        run_id, _ = self.runs.create(
            NewRun(template, key, options.pop("variables", {}), max_attempts, queue, **options)
        )
        return run_id

    def waiting(
        self,
        children: int = 2,
        client: str = "default",
        queue: str | None = None,
        priority: int = 5,
        template: str = "t",
        **options: Any,
    ) -> int:
        """A running run whose ``children`` children wait for the dispatcher."""
        run_id = self.submit(template, client=client, queue=queue, priority=priority, **options)
        plan = [{"i": i} for i in range(children)]
        assert self.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
        sent: list[int] = []
        state = self.runs.dispatch(run_id, lambda run, kids: sent.append(len(kids)), deferred=True)
        assert (state, sent) == (RunState.RUNNING, [0])  # the chord is fixed, nothing is sent
        return run_id

    def turn(self) -> AbstractContextManager[Pass | None]:
        """The dispatcher's turn, waited for (on PostgreSQL a worker's pass may hold it)."""
        return self.dispatch.turn(wait=10)

    def demanded(self) -> set[int]:
        """The runs a dispatcher's pass would find children of waiting."""
        with self.turn() as turn:
            assert turn is not None
            return {d.run_id for ds in turn.demands().values() for d in ds}

    def out(self, queue: str) -> Out | None:
        """What ``queue`` has out (None: nothing), as a dispatcher's pass counts it."""
        with self.turn() as turn:
            assert turn is not None
            return turn.out()[0].get(queue)

    def run(
        self,
        children: int = 3,
        max_attempts: int = 2,
        dispatched: bool = True,
        execution_cap: float | None = None,
    ) -> int:
        """A run of ``children`` children ({"i": index}), running once ``dispatched``."""
        run_id = self.make(children, max_attempts, execution_cap)
        if dispatched:
            assert self.runs.dispatch(run_id, lambda run, sent: None) is RunState.RUNNING
        return run_id

    def claim(self, run_id: int, index: int = 0, owner: str = "me", ttl: float = 30) -> Claim:
        taken = self.children.claim(run_id, index, owner, ttl)
        assert isinstance(taken, Claim), taken
        return taken

    def refusal(self, run_id: int, index: int = 0, owner: str = "late") -> Refusal:
        refused = self.children.claim(run_id, index, owner, 30)
        assert isinstance(refused, Refusal), refused
        return refused

    def take_over(self, run_id: int, index: int = 0, owner: str = "other") -> Claim:
        """Another worker takes the child once its holder's lease has run out."""
        self.expire(run_id, index)
        return self.claim(run_id, index, owner)

    def ranges(self, *bounds: tuple[int, int]) -> int:
        """A dispatched run whose children hold the ranges ``bounds`` ({"a", "b"})."""
        run_id = self.make_specs([{"a": a, "b": b} for a, b in bounds], 2)
        assert self.runs.dispatch(run_id, lambda run, sent: None) is RunState.RUNNING
        return run_id

    def message(
        self, run_id: int, indexes: Iterable[int], owner: str = "batch", ttl: float = 30
    ) -> dict[int, Claim]:
        """A message of the run's children taken by ``owner``: those that can be taken."""
        return self.children.claim_many(run_id, list(indexes), owner, ttl)

    def lapse(self, run_id: int, indexes: Iterable[int]) -> None:
        """The lease of a message's children has run out (its worker died or hung)."""
        for index in indexes:
            self.expire(run_id, index)

    def steal(self, run_id: int, indexes: Iterable[int], owner: str = "thief") -> dict[int, Claim]:
        """Another worker takes these children of a held message away from its holder (as it
        can today once their leases ran out): those it could take."""
        taken = list(indexes)
        self.lapse(run_id, taken)
        return self.message(run_id, taken, owner)

    def view(self, run_id: int, index: int = 0) -> ChildView:
        seen = self.children.view(run_id, index)
        assert seen is not None
        return seen

    def seen(self, run_id: int, index: int = 0) -> tuple[ChildState, int, str | None, Any]:
        """The child as an operator reads it: (state, attempt, owner, checkpoint)."""
        v = self.view(run_id, index)
        return v.state, v.attempt, v.owner, v.checkpoint

    def state(self, run_id: int) -> RunState:
        return self.runs.status(run_id).state


def memory() -> World:
    store = MemoryStore()

    def make(children: int, max_attempts: int, cap: float | None) -> int:
        specs = [{"i": i} for i in range(children)]
        return store.runs.add("t", specs, max_attempts, cap, {"n": children})

    def make_specs(specs: Sequence[Mapping[str, Any]], max_attempts: int) -> int:
        return store.runs.add("t", specs, max_attempts, None, {})

    def expire(run_id: int, index: int) -> None:
        """Its lease, or the lease of the message whose claim covers it."""
        row = store.row(run_id, index)
        row.lease_expires_at = store.tables.clock() - 1
        for m in store.tables.messages.values():
            if m.run_id == run_id and m.owner is not None and m.lo <= index <= m.hi:
                m.lease_expires_at = store.tables.clock() - 1

    def force(run_id: int, state: RunState) -> None:
        store.tables.runs[run_id].state = state

    return World(
        "memory", store.children, store.runs, make, expire, store.dispatch, store.clients,
        store.recovery, store.workers, force, lambda run, i: store.row(run, i).output,
        make_specs, lambda run, i: dict(store.row(run, i).spec),
        lambda run, i: store.row(run, i).sent_at is not None,
    )  # fmt: skip


def postgresql(store: Store) -> World:
    def make(children: int, max_attempts: int, cap: float | None) -> int:
        key = f"contract:{uuid.uuid4()}"
        new = NewRun("t", key, {"n": children}, max_attempts, None, execution_cap=cap)
        run_id, created = store.runs.create(new)
        assert created
        specs = [{"i": i} for i in range(children)]
        assert store.runs.split(run_id, lambda run, slots: specs) is RunState.SPLITTING
        return run_id

    def make_specs(specs: Sequence[Mapping[str, Any]], max_attempts: int) -> int:
        new = NewRun("t", f"contract:{uuid.uuid4()}", {}, max_attempts, None)
        run_id, created = store.runs.create(new)
        assert created
        assert store.runs.split(run_id, lambda run, slots: specs) is RunState.SPLITTING
        return run_id

    def expire(run_id: int, index: int) -> None:
        """Its lease, or the lease of the message whose claim covers it."""
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE dtask_children SET lease_expires_at = now() - interval '1 second'"
                    " WHERE run_id = :r AND index = :i"
                ),
                {"r": run_id, "i": index},
            )
            conn.execute(
                text(
                    "UPDATE dtask_messages SET lease_expires_at = now() - interval '1 second'"
                    " WHERE run_id = :r AND lo <= :i AND hi >= :i AND owner IS NOT NULL"
                ),
                {"r": run_id, "i": index},
            )

    def force(run_id: int, state: RunState) -> None:
        with store.engine.begin() as conn:
            conn.execute(
                text("UPDATE dtask_runs SET state = :s WHERE id = :id"),
                {"s": state.value, "id": run_id},
            )

    def output(run_id: int, index: int) -> str | None:
        detail = store.children.detail(run_id, index)
        return None if detail is None else detail.output

    def spec(run_id: int, index: int) -> dict[str, Any]:
        with store.engine.connect() as conn:
            found = conn.execute(
                text("SELECT spec FROM dtask_children WHERE run_id = :r AND index = :i"),
                {"r": run_id, "i": index},
            ).scalar_one()
        return dict(found)

    def sent(run_id: int, index: int) -> bool:
        with store.engine.connect() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT sent_at IS NOT NULL FROM dtask_children"
                        " WHERE run_id = :r AND index = :i"
                    ),
                    {"r": run_id, "i": index},
                ).scalar_one()
            )

    return World(
        "postgresql", store.children, store.runs, make, expire, store.dispatch, store.clients,
        store.recovery, store.workers, force, output, make_specs, spec, sent,
    )  # fmt: skip
