"""The async client (issue 43): a FastAPI app served by uvicorn submits 100 runs at once with
``await dtask.asubmit`` while its event loop goes on answering ``/ping`` (its latency printed:
bench/async_submit.py measures it); ``await run.aget()`` and ``await template.adelay()``
against real workers."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.acceptance.test_scale import held
from tests.conftest import WorkerProcess
from tests.support.asgi_submits import make_app, pinging, served, submit_all
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def test_a_fastapi_app_submits_100_runs_at_once_each_once_while_its_loop_answers(
    workers: list[WorkerProcess],
) -> None:
    prefix = uuid.uuid4().hex
    keys = [f"asgi-{prefix}-{i}" for i in range(100)]
    with served(make_app("tiny", {"n": 1, "fail_every": 0})) as base:
        with pinging(base) as idle:
            wait_for(lambda: len(idle.samples) >= 50, 60, "50 pings of an idle app")
        with pinging(base) as busy:
            answers = submit_all(base, keys)
        again = submit_all(base, keys[:10])
    print(f"\nping while idle: {idle}\nping during 100 concurrent submits: {busy}")

    ids = [a["id"] for a in answers]
    assert len(set(ids)) == 100 and all(a["created"] for a in answers)
    assert [a["id"] for a in again] == ids[:10]  # a key's run is created once
    assert not any(a["created"] for a in again)
    with services.store().engine.connect() as conn:
        count = conn.execute(
            text("SELECT count(*) FROM dtask_runs WHERE trigger_key = ANY(:keys)"), {"keys": keys}
        ).scalar()
    assert count == 100

    async def every_result() -> list[object]:
        runs = [dtask.get_run(i) for i in ids]
        return await asyncio.gather(*(r.aget(timeout=120) for r in runs))

    assert asyncio.run(every_result()) == [None] * 100  # each succeeded (tiny has no reduce)


def test_aget_returns_a_real_runs_result_and_adelay_submits(
    workers: list[WorkerProcess],
) -> None:
    async def main() -> tuple[object, object]:
        run = await dtask.asubmit("async_range", {"n": 40, "delay": 0.0, "hold": "none"})
        other = await dtask.registry.get("async_range").adelay(n=20, delay=0.0, hold="none")
        return await run.aget(timeout=120), await other.aget(timeout=120)

    assert asyncio.run(main()) == (sum(range(1, 41)), sum(range(1, 21)))


def test_aget_times_out_and_raises_as_get_does(workers: list[WorkerProcess], sink: Path) -> None:
    hold = held(sink)
    run = dtask.submit("async_range", {"n": 20, "delay": 0.0, "hold": hold.name})

    async def main() -> None:
        with pytest.raises(dtask.WaitTimeout, match=f"run {run.id} is still"):
            await run.aget(timeout=0.2)
        await asyncio.to_thread(run.cancel)
        with pytest.raises(dtask.RunCancelled, match=f"run {run.id} was cancelled"):
            await run.aget(timeout=60)
        with pytest.raises(dtask.UnknownTemplate):
            await dtask.asubmit("no_such_template", {})

    try:
        asyncio.run(main())
    finally:
        hold.unlink()
