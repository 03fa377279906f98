"""`/api/v1/runs`: submit, read (with a long poll), list, cancel and rerun."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api.auth import Caller
from dtask.api.errors import Refused
from dtask.api.waiting import waits
from dtask.client.runs import get_run, submit
from dtask.domain.deps import MAX_UPSTREAMS
from dtask.domain.runs import ChildState, RunState, RunStatus
from dtask.domain.tokens import Token
from dtask.exceptions import RunNotFound, UpstreamNotFound

router = APIRouter(prefix="/runs", tags=["runs"])
MOST_WAIT = 300.0


class RunRequest(BaseModel):
    """A submit: the same options as `dtask submit`."""

    model_config = ConfigDict(extra="forbid")

    template: str
    variables: dict[str, Any] = Field(default_factory=dict)
    key: str | None = None
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


def _upstreams(token: Token, body: RunRequest, client: str) -> list[int | str]:
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
    client = body.client or token.client
    if not token.sees(client):
        raise Refused(f"this token submits only as client {token.client!r}", 403)
    run = submit(
        body.template, body.variables, body.key,
        execution_cap=body.execution_cap, client=client, priority=body.priority,
        delay_tolerance=body.delay_tolerance, on_late=body.on_late, tier=body.tier,
        notify_url=body.notify_url, after=_upstreams(token, body, client) or None,
    )  # fmt: skip
    return _visible(token, run.id), run.created  # the key is the client's: its own run


@router.post("", status_code=201)
async def create_run(body: RunRequest, token: Caller, response: Response) -> dict[str, Any]:
    """Submit a run: 201 with it, or 200 with the run the client's key already triggered (a
    key is the client's own: another client's run of the same key is another run)."""
    status, created = await run_in_threadpool(_create, token, body)
    if not created:
        response.status_code = 200
    return status.as_json()


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
    return status.as_json()


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


def _act(token: Token, run_id: int, action: str) -> RunStatus:
    _visible(token, run_id)
    run = get_run(run_id)
    return run.cancel() if action == "cancel" else run.rerun()


@router.post("/{run_id}/cancel")
async def cancel_run(run_id: int, token: Caller) -> dict[str, Any]:
    return (await run_in_threadpool(_act, token, run_id, "cancel")).as_json()


@router.post("/{run_id}/rerun")
async def rerun_run(run_id: int, token: Caller) -> dict[str, Any]:
    return (await run_in_threadpool(_act, token, run_id, "rerun")).as_json()
