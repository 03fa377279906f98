"""`/api/v1/runs`: submit, read (with a long poll), list, cancel and rerun."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api.auth import Caller
from dtask.api.errors import Refused
from dtask.api.waiting import waits
from dtask.client.bulk import submit_many
from dtask.client.runs import get_run, submit
from dtask.client.waiting import why
from dtask.domain.bulk import MOST_PER_CHUNK, Outcome
from dtask.domain.deps import MAX_UPSTREAMS
from dtask.domain.runs import ChildState, RunState, RunStatus
from dtask.domain.tokens import Token
from dtask.domain.waiting import waiting_json
from dtask.exceptions import ChildNotFound, RunNotFound, UpstreamNotFound

router = APIRouter(prefix="/runs", tags=["runs"])
MOST_WAIT = 300.0


class Options(BaseModel):
    """A submit's options: the same as `dtask submit`'s."""

    model_config = ConfigDict(extra="forbid")

    template: str
    priority: int | None = None
    tier: str | None = None
    delay_tolerance: float | None = None
    on_late: str | None = None
    execution_cap: float | None = None
    client: str | None = Field(None, description="admin tokens only; default the token's client")
    after: list[int] | None = Field(
        None, max_length=MAX_UPSTREAMS, description="ids of runs it waits for (to succeed)"
    )
    after_keys: list[str] | None = Field(
        None,
        max_length=MAX_UPSTREAMS,
        description="trigger keys of runs it waits for (the submitting client's runs)",
    )
    notify_url: str | None = Field(None, description="POSTed the run's JSON when it finishes")
    concurrency_key: str | None = Field(
        None, description="runs of one key beyond max_concurrent wait (placeholders allowed)"
    )
    max_concurrent: int | None = Field(
        None, description="unfinished runs per concurrency key (default 1, or the template's)"
    )

    def submit_options(self, token: Token) -> dict[str, Any]:
        """The options as ``dtask.submit`` takes them, as the token may submit them."""
        client = self.client or token.client
        if not token.sees(client):
            raise Refused(f"this token submits only as client {token.client!r}", 403)
        return dict(
            execution_cap=self.execution_cap, client=client, priority=self.priority,
            delay_tolerance=self.delay_tolerance, on_late=self.on_late, tier=self.tier,
            notify_url=self.notify_url, after=_upstreams(token, self, client) or None,
            concurrency_key=self.concurrency_key, max_concurrent=self.max_concurrent,
        )  # fmt: skip


class RunRequest(Options):
    """A submit."""

    variables: dict[str, Any] = Field(default_factory=dict)
    key: str | None = None


class BatchItem(BaseModel):
    model_config = ConfigDict(extra="forbid")

    variables: dict[str, Any] = Field(default_factory=dict)
    key: str | None = None


class BatchRequest(Options):
    """Runs of one template with the same options, each with its variables and key."""

    runs: list[BatchItem] = Field(max_length=MOST_PER_CHUNK, description="one run each")


def _visible(token: Token, run_id: int) -> RunStatus:
    """The run, if this token may see it; another client's run is answered exactly as a run
    that does not exist."""
    try:
        status: RunStatus | None = services.store().runs.status(run_id)
    except RunNotFound:
        status = None
    if status is None or not token.sees(status.client):
        raise RunNotFound(f"no run with id {run_id}")
    return status


def _upstreams(token: Token, body: Options, client: str) -> list[int | str]:
    """The runs named in ``after`` and ``after_keys``, checked in one query; one that does
    not exist and another client's are answered alike. A key names a run of ``client``, the
    one submitting (as the submit resolves it), so another client's key is an unknown one."""
    after: list[int | str] = [*(body.after or []), *(body.after_keys or [])]
    if after and not token.admin:
        owners = services.store().runs.clients_of(body.after or [], body.after_keys or [], client)
        for named in after:
            if named not in owners or not token.sees(owners[named]):
                raise UpstreamNotFound(f"after: no run {named!r} (by id or trigger key) of yours")
    return after


def _create(token: Token, body: RunRequest) -> tuple[RunStatus, bool]:
    run = submit(body.template, body.variables, body.key, **body.submit_options(token))
    return _visible(token, run.id), run.created  # the key is the client's: its own run


def _create_many(token: Token, body: BatchRequest) -> dict[str, Any]:
    found = submit_many(
        body.template, [r.variables for r in body.runs], keys=[r.key for r in body.runs],
        **body.submit_options(token),
    )  # fmt: skip
    return {
        "runs": [s.as_json() for s in found],
        **{o.value: sum(s.outcome is o for s in found) for o in Outcome},
    }


@router.post("", status_code=201)
async def create_run(body: RunRequest, token: Caller, response: Response) -> dict[str, Any]:
    """Submit a run: 201 with it, or 200 with the run the client's key already triggered (a
    key is the client's own: another client's run of the same key is another run)."""
    status, created = await run_in_threadpool(_create, token, body)
    if not created:
        response.status_code = 200
    return status.as_json()


@router.post("/batch")
async def create_runs(body: BatchRequest, token: Caller) -> dict[str, Any]:
    """Submit up to 1,000 runs of one template with the same options in one transaction:
    200 with each run's outcome in input order (``created``, ``known_key`` with the run the
    client's key had triggered, ``invalid`` with its error, ``limit_exceeded`` with
    ``retry_after``) and how many of each. Rate limits count every run, in order."""
    return await run_in_threadpool(_create_many, token, body)


@router.get("/{run_id}")
async def read_run(
    run_id: int,
    token: Caller,
    wait: Annotated[float, Query(ge=0, le=MOST_WAIT, description="long-poll seconds")] = 0,
) -> dict[str, Any]:
    """The run; with ``wait`` the answer comes when it finishes or after ``wait`` seconds."""
    status = await run_in_threadpool(_visible, token, run_id)
    if wait and not status.finished:
        await waits.until_finished(run_id, wait)
        status = await run_in_threadpool(_visible, token, run_id)
    waiting = None if status.finished else await run_in_threadpool(why, run_id)
    return {**status.as_json(), **waiting_json(waiting)}


def _list(
    token: Token,
    state: RunState | None,
    client: str | None,
    template: str | None,
    schedule: str | None,
    limit: int,
    cursor: int | None,
) -> dict[str, Any]:
    if client is not None and not token.sees(client):
        raise Refused(f"this token sees only client {token.client!r}", 403)
    found = services.store().runs.statuses(
        limit, schedule, client=client if token.admin else token.client,
        state=state, template=template, before=cursor,
    )  # fmt: skip
    more = len(found) == limit
    return {"runs": [s.as_json() for s in found], "next_cursor": found[-1].id if more else None}


@router.get("")
async def list_runs(
    token: Caller,
    state: RunState | None = None,
    client: str | None = None,
    template: str | None = None,
    schedule: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[int | None, Query(description="next_cursor of the previous page")] = None,
) -> dict[str, Any]:
    """The latest runs, newest first, a page at a time."""
    return await run_in_threadpool(_list, token, state, client, template, schedule, limit, cursor)


def _children(
    token: Token, run_id: int, state: ChildState | None, limit: int, cursor: int | None
) -> dict[str, Any]:
    _visible(token, run_id)
    found = services.store().children.page(run_id, state, limit, cursor)
    more = len(found) == limit
    return {
        "children": [c.as_json() for c in found],
        "next_cursor": found[-1].index if more else None,
    }


@router.get("/{run_id}/children")
async def list_children(
    run_id: int,
    token: Caller,
    state: ChildState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(description="next_cursor of the previous page")] = None,
) -> dict[str, Any]:
    """The run's children in index order: range, attempts, checkpoint, error, worker."""
    return await run_in_threadpool(_children, token, run_id, state, limit, cursor)


def _logs(token: Token, run_id: int, index: int) -> dict[str, Any]:
    _visible(token, run_id)
    found = services.store().logs.of_child(run_id, index)
    if found is None:
        raise ChildNotFound(f"run {run_id} has no child {index}")
    return {"run_id": run_id, "index": index, "attempts": [a.as_json() for a in found[0]]}


@router.get("/{run_id}/children/{index}/logs")
async def child_logs(
    run_id: int, index: Annotated[int, Path(ge=0)], token: Caller
) -> dict[str, Any]:
    """What the child printed (stdout, stderr, ``ctx.log``), per attempt: its last
    DTASK_MAX_CHILD_LOG characters (``output``; ``skipped``: those before it not kept), the
    worker that ran it, how it ended (running, succeeded, failed, interrupted) and its error."""
    return await run_in_threadpool(_logs, token, run_id, index)


def _grid(token: Token, run_id: int) -> dict[str, Any]:
    status = _visible(token, run_id)
    runs = services.store().children.grid(run_id)
    return {
        "total": sum(n for _, n in runs),
        "runs": runs,
        "children": status.as_json()["children"],
    }


@router.get("/{run_id}/grid")
async def child_grid(run_id: int, token: Caller) -> dict[str, Any]:
    """Every child's state in index order, run-length encoded (``runs``: [[state, count],
    ...], ``waiting`` = not yet sent to the broker): the dashboard's grid."""
    return await run_in_threadpool(_grid, token, run_id)


def _act(token: Token, run_id: int, action: str, terminate: bool = False) -> RunStatus:
    _visible(token, run_id)
    run = get_run(run_id)
    return run.cancel(terminate) if action == "cancel" else run.rerun()


@router.post("/{run_id}/cancel")
async def cancel_run(run_id: int, token: Caller, terminate: bool = False) -> dict[str, Any]:
    """``?terminate=true``: running children that do not stop at their next step within
    DTASK_EXECUTION_CAP_GRACE have their pool process killed."""
    return (await run_in_threadpool(_act, token, run_id, "cancel", terminate)).as_json()


@router.post("/{run_id}/rerun")
async def rerun_run(run_id: int, token: Caller) -> dict[str, Any]:
    return (await run_in_threadpool(_act, token, run_id, "rerun")).as_json()
