"""Triggering runs and watching them: ``submit`` and the ``Run`` handle."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from types import ModuleType
from typing import Any, Unpack

from dtask import services, templating, tracing
from dtask.client import backlog
from dtask.client.awaiting import AsyncWaits, result_of
from dtask.client.transactions import written_on
from dtask.client.waiting import why
from dtask.db import Store
from dtask.db.run_inserts import Created
from dtask.domain.clients import DEFAULT_CLIENT, check_name, check_priority, tier_of
from dtask.domain.concurrency import Concurrency, check_concurrency, run_limit
from dtask.domain.deadlines import (
    check_delay_tolerance,
    check_queue,
    check_start,
    on_late_of,
)
from dtask.domain.deps import check_after
from dtask.domain.limits import check_json_size, check_key
from dtask.domain.notify import check_url
from dtask.domain.runs import NewRun, RunHandle, RunState, RunStatus
from dtask.domain.templates import RunOptions, Template, check_execution_cap, registry
from dtask.domain.waiting import Waiting
from dtask.exceptions import (
    BrokerUnavailable,
    Busy,
    DtaskError,
    InvalidVariables,
    NotCancellable,
    NothingToRerun,
    RunNotFound,
    TemplateDefinitionError,
    WaitTimeout,
)
from dtask.settings import Settings, is_redis

log = logging.getLogger("dtask.client")


class Run(AsyncWaits):
    """A handle on one master run. PostgreSQL answers every question about it (``aget``:
    dtask/client/awaiting.py)."""

    def __init__(self, run_id: int, *, created: bool = True) -> None:
        self.id = run_id
        self.created = created

    def __repr__(self) -> str:
        return f"<dtask.Run {self.id}>"

    def status(self) -> RunStatus:
        return services.store().runs.status(self.id)

    def waiting(self) -> Waiting | None:
        """Why the run, or its next children, do not run now (None: nothing holds it)."""
        return why(self.id)

    # Celery's AsyncResult names, for a team that already speaks them

    @property
    def state(self) -> RunState:
        return self.status().state

    def ready(self) -> bool:
        """Finished: succeeded, failed or cancelled."""
        return self.state.finished

    def successful(self) -> bool:
        return self.state is RunState.SUCCEEDED

    def failed(self) -> bool:
        """Failed or cancelled (Celery counts a revoked task as failed)."""
        return self.state in (RunState.FAILED, RunState.CANCELLED)

    def get(self, timeout: float | None = None) -> Any:
        """Wait for the run and return its result (its template's ``reduce`` of the children's
        return values; None without one), or raise RunFailed (RunCancelled) with its error, as
        ``AsyncResult.get`` does; WaitTimeout after ``timeout`` seconds."""
        return result_of(self.wait(timeout))

    def revoke(self) -> None:
        """Celery's name for cancel; a finished run is left as it is (as revoking a finished
        task changes nothing)."""
        if not self.ready():
            with contextlib.suppress(NotCancellable):
                self.cancel()

    def cancel(self, terminate: bool = False) -> RunStatus:
        """Cancel: pending children never start; running ones stop at their next checkpoint
        (with ``terminate``, one that has not stopped within DTASK_EXECUTION_CAP_GRACE has its
        pool process killed). Idempotent; a run that already succeeded or failed raises
        NotCancellable."""
        store = services.store()
        state = store.runs.cancel(self.id, terminate)
        if state is not RunState.CANCELLED:
            raise NotCancellable(f"run {self.id} already {state.value}: nothing to cancel")
        from dtask.worker.finalize import forget_run  # (see _eager)

        forget_run(store, self.id)
        return self.status()

    def rerun(self) -> RunStatus:
        """Run a failed or cancelled run's unfinished and failed children again, each from its
        checkpoint. Idempotent while the rerun is going; a succeeded run raises NothingToRerun."""
        store = services.store()
        state = store.runs.rerun(self.id)
        if state is RunState.SUCCEEDED:
            raise NothingToRerun(f"run {self.id} succeeded: nothing to rerun")
        if state in (RunState.PENDING, RunState.SPLITTING):
            eager = _eager()
            if eager.active():  # test mode: rerun here, as it ran
                eager.run(self.id)
            else:
                _send_master(self.id)
        return self.status()

    def wait(
        self,
        timeout: float | None = None,
        *,
        poll: float = 0.5,
        on_progress: Callable[[RunStatus], None] | None = None,
    ) -> RunStatus:
        """Block until the run has finished; return its final status.

        Each poll reads only the run's state (one row, whatever its size); its children are
        counted for ``on_progress`` at most every ``PROGRESS_COST`` times the count's own
        time, so watching a million-child run costs little. Raises WaitTimeout if ``timeout``
        seconds pass first (the run keeps going).
        """
        store = services.store()
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.05, poll)
        counted_at = counting = 0.0
        while True:
            state = store.runs.state_of(self.id)
            now = time.monotonic()
            if state.finished or (
                on_progress is not None and now - counted_at >= counting * PROGRESS_COST
            ):
                status = self.status()
                counted_at, counting = time.monotonic(), time.monotonic() - now
                if on_progress is not None:
                    on_progress(status)
                if status.finished:
                    return status
            if deadline is not None and time.monotonic() >= deadline:
                status = self.status()
                raise WaitTimeout(
                    f"run {self.id} is still {status.state.value} after {timeout:g} s"
                    f" ({status.children.finished}/{status.children.total} children done)"
                    + (f": it waits because {w.text}" if (w := self.waiting()) else "")
                )
            time.sleep(
                delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
            )
            delay = min(delay * 2, poll)


PROGRESS_COST = 20  # a progress count at most every 20x its own time (5 % of one core at most)


@tracing.submit_span
def submit(
    template: str,
    variables: dict[str, Any],
    key: str | None = None,
    *,
    using: str | None = None,
    connection: Any = None,
    **options: Unpack[RunOptions],
) -> Run:
    """Trigger ``template`` once per ``key`` of ``client`` (a fresh key if None); return the
    run. A key is the client's own: another client's run of the same key is another run.

    ``execution_cap`` (seconds) overrides the template's cap on each child's attempts;
    ``delay_tolerance`` (seconds) and ``on_late`` ("run" or "fail") the template's deadline
    to start (see docs/scheduling.md). The run is charged to ``client`` (RateLimited when
    its rate limits refuse it, ClientNotFound for a client never set up); ``priority`` 0 to
    9 (default 5) is capped at the client's maximum; ``tier`` ("basic", "regular" or
    "premium"; default the template's, else the client's) too. ``notify_url`` gets a POST
    of the run's JSON when it finishes, signed with the client's secret (docs/api.md).
    ``countdown`` (seconds) or ``eta`` (a datetime; naive means UTC) hold its start back, as
    Celery's ``apply_async`` does; ``queue`` sends its children to another queue than the
    template's. ``after`` names runs (ids, ``Run`` handles, or trigger keys as strings, which
    name runs of ``client``) it waits for: it is ``waiting`` until they all succeed, and fails
    if one fails or is cancelled (UpstreamNotFound for a run that does not exist; see
    docs/dependencies.md).
    Variables are checked before anything is written. If the master message cannot be sent,
    the run is removed again and BrokerUnavailable raised: no run is left half-created.

    ``using`` (a Django database alias) or ``connection`` (a psycopg 3 connection, a
    SQLAlchemy ``Connection`` or a Django connection) writes the run in the caller's open
    transaction, where dtask's tables are in the caller's database: a rollback leaves no run
    and sends nothing; once committed it runs (its master is sent after Django's commit; on a
    connection of another kind the reaper sends it within DTASK_STALL_TIMEOUT). The ``Run``
    it returns is readable once the caller has committed. Keys, rate limits and upstreams are
    checked as always, in the caller's transaction: another submit of the same key waits for
    it to end, and a limited client's row stays locked until then.

    In test mode (DTASK_EAGER, or Celery's ``task_always_eager``) the run executes here before
    this returns (split, children, reduce), whatever ``countdown``, ``eta``, ``using`` or
    ``connection`` say, and nothing is sent to the broker (dtask/worker/eager.py).
    """
    prepared = prepare(template, **options)
    tpl, config, eager_mode = prepared.template, prepared.settings, prepared.eager
    new_run = prepared.run(variables, key)
    if not eager_mode and config.pickup and _awaits_pickup(new_run):
        new_run = replace(new_run, awaits_pickup=True)
    store = services.store()
    create = partial(store.runs.create_run, new_run)

    def shown(run_id: int) -> str:  # what Flower and the logs show of its master
        return f"{tpl.name} run {run_id} key {new_run.key}"

    if eager_mode:
        run = create()
        if run.created:
            _eager().run(run.id)
        return Run(run.id, created=run.created)
    try:
        backlog.check(new_run, config)
    except Busy:  # a key already triggered still answers with its run, as below the cap
        found = store.runs.known_runs([new_run])[0] if key is not None else None
        if found is None:
            raise
        if isinstance(found, DtaskError):
            raise found from None
        return Run(found.id, created=False)
    if using is not None or connection is not None:
        with written_on(using, connection) as written:
            run = create(on=written.conn)
        backlog.added(new_run, run.created)
        if run.state is RunState.PENDING and run.starts_in <= config.stall_timeout:
            written.after_commit(partial(_send_committed, run, new_run, shown(run.id)))
        return Run(run.id, created=run.created)
    run = create()
    run_id, created = run.id, run.created
    backlog.added(new_run, created)
    if run.starts_in > config.stall_timeout:
        return Run(run_id, created=created)  # the reaper starts it when it is due
    if run.state is RunState.PENDING:  # not waiting for upstreams, nor failed by one
        try:
            _start(run, new_run, shown(run_id))
        except BrokerUnavailable as exc:
            if created and store.runs.forget_unsent(run_id):
                raise BrokerUnavailable(f"{exc}; no run was created") from None
            if created:
                raise BrokerUnavailable(
                    f"{exc}; run {run_id} stays (a run was submitted after it) and starts when"
                    " the broker is back"
                ) from None
            raise
    return Run(run_id, created=created)


@dataclass(frozen=True)
class Prepared:
    """A submit's options, checked once (for one run, or every run of a bulk submit): the
    template, the run every item becomes with its own key and variables, the settings."""

    template: Template
    base: NewRun
    settings: Settings
    eager: bool
    concurrency: Concurrency | None = None

    def run(self, variables: dict[str, Any], key: str | None) -> NewRun:
        """The run of ``variables`` and ``key`` (a fresh key if None); InvalidVariables or
        InvalidKey (a DtaskError) where they are refused, before anything is written."""
        tpl, where = self.template, f"run of template {self.template.name!r}"
        if key is not None:
            check_key(key, where)
        checked = tpl.validate(variables)
        check_json_size(
            f"the variables of {where}", checked, self.settings.max_variables,
            "DTASK_MAX_VARIABLES", InvalidVariables,
        )  # fmt: skip
        _, children = tpl.count(checked, self.settings.max_children)
        return replace(
            self.base,
            key=key or f"adhoc:{uuid.uuid4()}",
            variables=checked,
            expected_children=children,
            **run_limit(self.concurrency, checked, where),
        )


def prepare(template: str, **options: Unpack[RunOptions]) -> Prepared:
    """``submit``'s options checked (see there), in one place for one run or many."""
    unknown = sorted(set(options) - set(RunOptions.__annotations__))
    if unknown:  # as Python says it of a keyword a signature lacks
        raise TypeError(f"submit() got an unexpected keyword argument {unknown[0]!r}")
    client = options.get("client", DEFAULT_CLIENT)
    priority, tier = options.get("priority"), options.get("tier")
    notify_url, on_late = options.get("notify_url"), options.get("on_late")
    eager_mode = _eager().active()
    if eager_mode:
        templating.load_templates(services.current().settings)  # no broker: none is used
    else:
        _app()
    config = services.current().settings
    tpl = registry.get(template)
    if getattr(tpl.function, "__module__", None) == "__main__":
        raise TemplateDefinitionError(
            f"template {tpl.name!r} is defined in the script being run (__main__), which workers"
            " cannot import: define templates in a module that workers import, and name it in"
            " DTASK_TEMPLATES"
        )
    where = f"run of template {tpl.name!r}"
    cap = check_execution_cap(options.get("execution_cap"), where)
    tolerance = (
        check_delay_tolerance(options.get("delay_tolerance"), where) or tpl.options.delay_tolerance
    )
    late_policy = tpl.options.on_late if on_late is None else on_late_of(on_late, where)
    check_name(client)
    wanted_tier = tier_of(tier) if isinstance(tier, str) else tier
    check_url(notify_url, allow_private=config.notify_allow_private)
    start_at, start_in = check_start(options.get("countdown"), options.get("eta"), where)
    if eager_mode:  # as Celery's eager apply_async: it runs now
        start_at = start_in = None
    if priority is not None:
        check_priority(priority)
    base = NewRun(
        template=tpl.name,
        key="",
        variables={},
        max_attempts=tpl.options.max_attempts,
        queue=check_queue(options.get("queue"), where) or tpl.options.queue,
        execution_cap=cap,
        client=client,
        priority=priority,
        delay_tolerance=tolerance,
        on_late=late_policy,
        tier=wanted_tier or tpl.options.tier,
        notify_url=notify_url,
        start_at=start_at,
        start_in=start_in,
        after=_upstreams(services.store(), options.get("after"), where, client),
        trace_context=tracing.carrier(),
    )
    return Prepared(tpl, base, config, eager_mode, _concurrency(tpl, options, where))


def _concurrency(tpl: Template, options: RunOptions, where: str) -> Concurrency | None:
    """The run's concurrency key and limit: the submit's where it names them (a limit alone
    changes the template's key's), else the template's."""
    key, most = options.get("concurrency_key"), options.get("max_concurrent")
    own = tpl.options.concurrency
    if own is not None:
        key = own.key if key is None else key
        most = own.most if most is None else most
    return check_concurrency(key, most, where, set(tpl.params))


def _start(run: Created, new_run: NewRun, shown: str) -> None:
    """A pickup asked for the run this submit created to wait for one, else its master sent
    (BrokerUnavailable where the broker cannot take either)."""
    if run.created and new_run.awaits_pickup:
        from dtask.worker.masters import ask_pickup  # (see _eager)

        ask_pickup(run.priority)
    else:
        _send_master(
            run.id,
            countdown=run.starts_in,
            shown=shown,
            priority=run.priority,
            template=new_run.template,
        )


def _awaits_pickup(run: NewRun) -> bool:
    """Whether a submit's run waits for a pickup (dtask/worker/pickup.py, DTASK_PICKUP) rather
    than sending its own master: where the broker is Redis (the ask is a key there), for a
    run due now that waits for no upstream."""
    return (
        not run.after
        and not run.concurrency_key  # its key's admission sends it, or the finish of another
        and run.start_in is None
        and run.start_at is None
        and is_redis(str(_app().conf.broker_url))
    )


def _eager() -> ModuleType:
    """``dtask.worker.eager``, imported when a run is submitted or sent: the worker side brings
    Celery, kombu and redis-py (0.25 s of CPU), which commands that only read (`dtask status`,
    `dtask runs`) never need."""
    from dtask.worker import eager

    return eager


def _send_master(run_id: int, **options: Any) -> None:
    from dtask.worker.messages import send_master  # (see _eager)

    send_master(run_id, **options)


def _app() -> Any:
    from dtask.worker import configure  # (see _eager)

    return configure()


def _send_committed(run: Created, new_run: NewRun, shown: str) -> None:
    """The master of a run the caller's transaction committed; where the broker cannot take
    it, the run stays pending and the reaper sends it (the commit is not undone)."""
    try:
        _start(run, new_run, shown)
    except BrokerUnavailable as exc:
        log.warning("run %s: committed, its master not sent (the reaper will): %s", run.id, exc)


def _upstreams(
    store: Store, after: Iterable[int | str | RunHandle] | None, where: str, client: str
) -> tuple[int, ...]:
    """The runs ``after`` names; its trigger keys name runs of ``client``, the submitter."""
    if after is None:
        return ()
    if isinstance(after, str | int) or hasattr(after, "id"):
        after = [after]  # type: ignore[list-item]
    named = list(after)
    keys = [a for a in named if isinstance(a, str)]
    ids = store.runs.ids_by_key(keys, client) if keys else {}
    return check_after(
        [ids[a] if isinstance(a, str) else getattr(a, "id", a) for a in named], where
    )


def get_run(run_id: int) -> Run:
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise RunNotFound(f"no run with id {run_id!r}: a run id is an integer (see `dtask runs`)")
    services.store().runs.status(run_id)  # raises RunNotFound
    return Run(run_id, created=False)
