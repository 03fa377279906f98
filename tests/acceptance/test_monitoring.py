"""Monitoring against real processes: /metrics counts what happened (a refused submit, a killed
worker's expired leases and their failover), and a killed worker's alert is logged once, POSTed
to DTASK_ALERT_WEBHOOK when it opens and again when the worker comes back."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from dtask import services
from tests.conftest import WorkerProcess
from tests.support.api import Receiver, call, start_server, token
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def scrape(base: str, secret: str | None) -> tuple[int, str, dict[str, float]]:
    """(status, content type, {'name{label="v",...}': value})."""
    request = urllib.request.Request(base.removesuffix("/api/v1") + "/metrics")
    if secret:
        request.add_header("Authorization", f"Bearer {secret}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            body, kind = response.read().decode(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], {}
    values = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return 200, kind, values


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    try:
        yield got
    finally:
        got.close()


def events(receiver: Receiver, subject: str) -> list[str]:
    sent = [json.loads(body) for _, body in receiver.got]
    return [e["event"] for e in sent if e["alert"]["subject"] == subject]


def owned_children(run_id: int) -> int:
    with services.store().engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'running'"),
                {"r": run_id},
            ).scalar_one()
        )


def test_metrics_count_refusals_and_a_killed_worker_s_failover_and_its_alert_is_sent_once(
    dtask_env: dict[str, str], receiver: Receiver, tmp_path: Path
) -> None:
    import dtask

    env = {**dtask_env, "DTASK_ALERT_WEBHOOK": receiver.url}
    server, base = start_server(env, tmp_path / "serve.log")
    name = f"mon-doomed-{int(time.time())}@test"
    doomed = WorkerProcess(env, tmp_path / "doomed.log", "-c", "2", "--hostname", name)
    survivor: WorkerProcess | None = None
    try:
        dtask.set_client("mon-a")
        dtask.set_client("mon-limited", rate="1/h")
        admin, a = token(dtask_env, "default", "--admin"), token(dtask_env, "mon-a")
        limited = token(dtask_env, "mon-limited")
        assert scrape(base, None)[0] == 401
        assert scrape(base, a)[0] == 403
        status, kind, before = scrape(base, admin)
        assert status == 200 and kind.startswith("text/plain; version=")
        assert 'dtask_runs{state="succeeded"}' in before
        assert 'dtask_alerts_open{kind="worker_lost"}' in before

        small = {"template": "print_range", "variables": {"n": 5}}
        assert call(base, "POST", "/runs", limited, small).status == 201
        assert call(base, "POST", "/runs", limited, small).status == 429
        refused = scrape(base, admin)[2]
        assert refused['dtask_rate_limit_refusals_total{client="mon-limited"}'] == 1

        doomed.wait_ready()
        body = {"template": "slow_range", "variables": {"n": 200, "delay": 0.1}}  # 10 x 2 s
        run = call(base, "POST", "/runs", a, body).body
        wait_for(lambda: owned_children(run["id"]) >= 1, 60, "a child running on the doomed")
        doomed.kill()
        survivor = WorkerProcess(env, tmp_path / "survivor.log", "-c", "2")
        survivor.wait_ready()
        done = call(base, "GET", f"/runs/{run['id']}?wait=120", a).body
        assert done["state"] == "succeeded"

        after = scrape(base, admin)[2]
        for counter in ("dtask_lease_expiries_total{}", "dtask_failover_seconds_count{}",
                        "dtask_children_redispatched_total{}"):  # fmt: skip
            assert after[counter] >= before[counter] + 1, counter
        assert after['dtask_runs{state="succeeded"}'] > before['dtask_runs{state="succeeded"}']
        ttl = services.current().settings.lease_ttl
        assert after["dtask_failover_seconds_sum{}"] - before["dtask_failover_seconds_sum{}"] >= ttl

        wait_for(lambda: events(receiver, name) == ["opened"], 60, "the worker_lost alert")
        (opened,) = [json.loads(b) for _, b in receiver.got if name in b.decode()]
        assert opened["alert"]["kind"] == "worker_lost"
        assert opened["alert"]["message"].startswith(f"worker {name} stopped reporting")
        alerts = call(base, "GET", "/alerts", a).body
        assert any(x["subject"] == name for x in alerts)

        back = WorkerProcess(env, tmp_path / "back.log", "-c", "1", "--hostname", name)
        try:
            back.wait_ready()
            wait_for(lambda: events(receiver, name) == ["opened", "closed"], 60, "its close")
        finally:
            back.stop()
        logs = server.output() + survivor.output() + back.output() + doomed.output()
        assert len(re.findall(rf"alert opened: worker {re.escape(name)} ", logs)) == 1
        assert len(re.findall(rf"alert closed: worker {re.escape(name)} ", logs)) == 1
        assert receiver.url not in logs  # the webhook URL may hold a secret
    finally:
        doomed.stop()
        if survivor is not None:
            survivor.stop()
        server.stop()
