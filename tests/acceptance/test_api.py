"""The HTTP API against a real `dtask serve` process, real PostgreSQL and workers: every status
code of a submit, tokens that keep clients apart, a long poll that answers when the run ends."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from dtask import services
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.api import Receiver, call, start_server, token
from tests.support.db import run_count

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def api(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    jobs = REPO / "tests" / "support" / "commands" / "jobs.toml"  # command templates too
    env = {**dtask_env, "DTASK_TEMPLATES": f"{dtask_env['DTASK_TEMPLATES']},{jobs}"}
    server, base = start_server(env, tmp_path_factory.mktemp("api") / "serve.log")
    try:
        yield base
    finally:
        server.stop()
        assert "dtk_" not in server.output()  # no token in the server's log


@pytest.fixture(scope="module")
def tokens(dtask_env: dict[str, str]) -> dict[str, str]:
    import dtask

    dtask.set_client("api-a")
    dtask.set_client("api-b")
    dtask.set_client("api-limited", rate="1/h")
    return {
        "a": token(dtask_env, "api-a"),
        "b": token(dtask_env, "api-b"),
        "limited": token(dtask_env, "api-limited"),
        "admin": token(dtask_env, "default", "--admin"),
    }


def test_submit_answers_with_the_status_each_outcome_calls_for(
    api: str, tokens: dict[str, str]
) -> None:
    a = tokens["a"]
    new = {"template": "print_range", "variables": {"n": 10}, "key": f"api-{time.time()}"}
    before = run_count()

    missing = call(api, "POST", "/runs", None, new)
    assert missing.status == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "token is required" in missing.body["error"]
    assert call(api, "POST", "/runs", "dtk_forged", new).status == 401

    created = call(api, "POST", "/runs", a, new)
    assert created.status == 201, created.body
    assert created.body["client"] == "api-a" and created.body["template"] == "print_range"
    again = call(api, "POST", "/runs", a, new)
    assert (again.status, again.body["id"]) == (200, created.body["id"])
    conflict = call(api, "POST", "/runs", a, {**new, "variables": {"n": 11}})
    assert conflict.status == 409 and "already triggered run" in conflict.body["error"]

    bad = call(api, "POST", "/runs", a, {"template": "print_range", "variables": {"n": "x"}})
    assert bad.status == 422 and bad.body["fields"] == {
        "n": "variable 'n' must be int, got str 'x'"
    }
    worse = call(api, "POST", "/runs", a, {"template": "print_range", "variables": {"m": 1}})
    assert worse.status == 422 and set(worse.body["fields"]) == {"m", "n"}
    form = urllib.request.Request(api + "/runs", data=b"template=print_range", method="POST")
    form.add_header("Authorization", f"Bearer {a}")
    with pytest.raises(urllib.error.HTTPError) as not_json:
        urllib.request.urlopen(form, timeout=30)
    with not_json.value as refused:
        assert refused.code == 415 and "Content-Type: application/json" in refused.read().decode()
    shape = call(api, "POST", "/runs", a, {"template": "print_range", "priority": "high"})
    assert shape.status == 422 and "priority" in shape.body["fields"]
    unknown = call(api, "POST", "/runs", a, {"template": "nope", "variables": {}})
    assert unknown.status == 404 and "unknown template 'nope'" in unknown.body["error"]
    other = call(api, "POST", "/runs", a, {**new, "key": None, "client": "api-b"})
    assert other.status == 403

    limited = {"template": "print_range", "variables": {"n": 5}}
    assert call(api, "POST", "/runs", tokens["limited"], limited).status == 201
    refused = call(api, "POST", "/runs", tokens["limited"], limited)
    assert refused.status == 429 and "limit exceeded" in refused.body["error"]
    assert 0 < int(refused.headers["retry-after"]) <= 3600
    assert run_count() == before + 2  # the first submit and the limited client's one

    for run_id in (created.body["id"],):
        call(api, "POST", f"/runs/{run_id}/cancel", a)


def test_a_submit_with_the_broker_down_is_503_and_creates_nothing(
    dtask_env: dict[str, str], tokens: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **dtask_env,
        "DTASK_DATABASE_URL": services.database_url(),
        "DTASK_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    server, base = start_server(env, tmp_path / "serve.log")
    try:
        before = run_count()
        reply = call(base, "POST", "/runs", tokens["a"], {"template": "print_range",
                                                           "variables": {"n": 3}})  # fmt: skip
        assert reply.status == 503 and "cannot reach the broker" in reply.body["error"]
        assert "no run was created" in reply.body["error"]
        assert run_count() == before
    finally:
        server.stop()


def test_clients_see_only_their_runs_and_a_long_poll_answers_when_the_run_ends(
    api: str, tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    a, b, admin = tokens["a"], tokens["b"], tokens["admin"]
    body = {"template": "slow_range", "variables": {"n": 40, "delay": 0.05}}
    run = call(api, "POST", "/runs", a, body).body
    foreign = call(api, "GET", f"/runs/{run['id']}", b)
    missing = call(api, "GET", "/runs/987654321", b)
    assert (foreign.status, missing.status) == (404, 404)
    assert foreign.body["error"].replace(str(run["id"]), "N") == missing.body["error"].replace(
        "987654321", "N"
    )  # another client's run reads exactly as one that does not exist
    assert call(api, "POST", f"/runs/{run['id']}/cancel", b).status == 404
    assert run["id"] not in [r["id"] for r in call(api, "GET", "/runs", b).body["runs"]]
    assert call(api, "GET", "/runs?client=api-a", b).status == 403
    assert call(api, "GET", f"/runs/{run['id']}", admin).status == 200

    done = call(api, "GET", f"/runs/{run['id']}?wait=60", a)
    answered = time.monotonic()
    assert done.status == 200 and done.body["state"] == "succeeded"
    with services.store().engine.connect() as conn:
        ended_ago = conn.execute(
            text("SELECT extract(epoch FROM now() - finished_at) FROM dtask_runs WHERE id = :r"),
            {"r": run["id"]},
        ).scalar_one()
    late = float(ended_ago) - (time.monotonic() - answered)  # from the run's end to the answer
    print(f"\nlong poll answered {late:.2f} s after the run finished")
    assert late <= 1.0, "the long poll answered late"

    mine = call(api, "GET", "/runs?limit=1", a).body
    assert len(mine["runs"]) == 1 and mine["next_cursor"] == mine["runs"][0]["id"]
    page = call(api, "GET", f"/runs?limit=1&cursor={mine['next_cursor']}", a).body
    assert page["runs"][0]["id"] < mine["runs"][0]["id"]
    assert all(r["client"] == "api-a" for r in call(api, "GET", "/runs", a).body["runs"])

    rerun = call(api, "POST", f"/runs/{run['id']}/rerun", a)
    assert rerun.status == 409 and "nothing to rerun" in rerun.body["error"].lower()
    assert call(api, "GET", "/clients", a).status == 403
    assert {c["name"] for c in call(api, "GET", "/clients", admin).body} >= {"api-a", "api-b"}
    templates = {t["name"]: t for t in call(api, "GET", "/templates", a).body}
    assert templates["slow_range"]["params"]["n"]["type"] == "int"
    assert templates["count_cmd"]["params"]["tag"]["default"] == "plain"  # from a TOML file
    assert len(call(api, "GET", "/workers", a).body) >= 2


def test_the_openapi_document_lists_the_endpoints(api: str) -> None:
    with urllib.request.urlopen(api + "/openapi.json", timeout=30) as response:
        paths = json.loads(response.read())["paths"]
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/runs/{run_id}/cancel"} <= set(paths)
    assert {"/api/v1/runs/{run_id}/grid", "/api/v1/alerts", "/metrics"} <= set(paths)
    assert "/api/v1/runs/batch" in paths
    with urllib.request.urlopen(api.removesuffix("/api/v1") + "/", timeout=30) as page:
        assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert page.headers["X-Frame-Options"] == "DENY" and b'id="login"' in page.read()
    with urllib.request.urlopen(api + "/docs", timeout=30) as docs:  # its scripts are on a CDN
        assert "Content-Security-Policy" not in docs.headers and b"swagger" in docs.read()


def test_a_revoked_token_is_refused_at_once(
    api: str, dtask_env: dict[str, str], tokens: dict[str, str]
) -> None:
    secret = token(dtask_env, "api-b")
    assert call(api, "GET", "/runs", secret).status == 200
    listed = subprocess.run(
        [DTASK, "token", "list", "--json"], env=dtask_env, cwd=REPO, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert secret not in listed.stdout
    mine = [t for t in json.loads(listed.stdout) if secret.startswith(t["hint"].rstrip("."))]
    subprocess.run([DTASK, "token", "revoke", str(mine[-1]["id"])], env=dtask_env, check=True,
                   cwd=REPO, capture_output=True, timeout=60)  # fmt: skip
    assert call(api, "GET", "/runs", secret).status == 401


def test_schedules_over_http_for_admin_tokens(api: str, tokens: dict[str, str]) -> None:
    admin, name = tokens["admin"], f"api-{int(time.time() * 1000)}"
    body = {"template": "print_range", "variables": {"n": 5}, "cron": "0 3 * * *", "tz": "UTC"}
    assert call(api, "PUT", f"/schedules/{name}", tokens["a"], body).status == 403
    created = call(api, "PUT", f"/schedules/{name}", admin, body)
    assert created.status == 201, created.body
    assert created.body["cron"] == "0 3 * * *" and len(created.body["next_slots"]) == 5
    assert created.body["latest_runs"] == []
    replaced = call(api, "PUT", f"/schedules/{name}", admin, {**body, "variables": {"n": 6}})
    assert replaced.status == 200 and replaced.body["variables"] == {"n": 6}
    bad = call(api, "PUT", f"/schedules/{name}", admin, {**body, "cron": "0 25 * * *"})
    assert bad.status == 422 and "hour" in bad.body["error"]
    assert call(api, "POST", f"/schedules/{name}/pause", admin).body["enabled"] is False
    assert call(api, "POST", f"/schedules/{name}/resume", admin).body["enabled"] is True
    assert name in [s["name"] for s in call(api, "GET", "/schedules", admin).body]
    days = {"from": "2026-03-01T00:00", "to": "2026-03-03T23:00"}
    filled = call(api, "POST", f"/schedules/{name}/backfill", admin, days)
    assert filled.status == 200, filled.body
    assert (filled.body["slots"], filled.body["created"], len(filled.body["runs"])) == (3, 3, 3)
    again = call(api, "POST", f"/schedules/{name}/backfill", admin, days).body
    assert (again["created"], again["existing"], again["runs"]) == (0, 3, filled.body["runs"])
    assert call(api, "POST", f"/schedules/{name}/backfill", tokens["a"], days).status == 403
    wrong = call(
        api, "POST", f"/schedules/{name}/backfill", admin, {"from": days["to"], "to": days["from"]}
    )
    assert wrong.status == 422 and "is before its --from" in wrong.body["error"]
    removed = urllib.request.Request(f"{api}/schedules/{name}", method="DELETE")
    removed.add_header("Authorization", f"Bearer {admin}")
    with urllib.request.urlopen(removed, timeout=30) as response:
        assert response.status == 204
    assert call(api, "GET", f"/schedules/{name}", admin).status == 404


def test_a_run_s_children_with_their_ranges_attempts_and_errors(
    api: str, tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    a = tokens["a"]
    body = {"template": "always_fails", "variables": {"n": 30, "bad": 15}}  # 3 children of 10
    run = call(api, "POST", "/runs", a, body).body
    assert call(api, "GET", f"/runs/{run['id']}?wait=60", a).body["state"] == "failed"
    assert call(api, "GET", f"/runs/{run['id']}/children", tokens["b"]).status == 404
    failed = call(api, "GET", f"/runs/{run['id']}/children?state=failed", a).body
    assert [c["index"] for c in failed["children"]] == [1]
    child = failed["children"][0]
    assert child["spec"] == {"a": 11, "b": 20, "bad": 15}
    assert child["attempt"] == child["max_attempts"] and "item 15 is poison" in child["error"]
    first = call(api, "GET", f"/runs/{run['id']}/children?limit=2", a).body
    assert [c["index"] for c in first["children"]] == [0, 1] and first["next_cursor"] == 1
    rest = call(api, "GET", f"/runs/{run['id']}/children?cursor=1", a).body
    assert [c["index"] for c in rest["children"]] == [2] and rest["next_cursor"] is None
    assert rest["children"][0]["state"] == "succeeded"
    assert rest["children"][0]["worker"]  # the one that ran it, though it is done
    logs = call(api, "GET", f"/runs/{run['id']}/children/1/logs", a)
    assert logs.status == 200, logs.body
    assert [x["state"] for x in logs.body["attempts"]] == ["failed"] * child["max_attempts"]
    assert all(x["worker"] and "item 15 is poison" in x["error"] for x in logs.body["attempts"])
    for path, who in (
        (f"/runs/{run['id']}/children/9/logs", a),
        (f"/runs/{run['id']}/children/1/logs", tokens["b"]),
    ):
        assert call(api, "GET", path, who).status == 404


def test_a_finished_run_is_posted_signed_to_its_notify_url_and_retried(
    api: str, dtask_env: dict[str, str], tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    import hashlib
    import hmac

    from tests.support.db import wait_for

    receiver = Receiver(fail_first=True)
    try:
        body = {"template": "print_range", "variables": {"n": 50}, "notify_url": receiver.url}
        run = call(api, "POST", "/runs", tokens["a"], body).body
        assert run["notify"] == {
            "url": receiver.url, "state": "waiting", "attempts": 0, "error": None,
            "delivered_at": None,
        }  # fmt: skip
        wait_for(lambda: len(receiver.got) >= 2, 60, "the notification's second try")
        done = call(api, "GET", f"/runs/{run['id']}", tokens["a"]).body
        assert done["state"] == "succeeded"
        assert done["notify"]["state"] == "delivered" and done["notify"]["attempts"] == 2
        secret = subprocess.run(
            [DTASK, "client", "secret", "api-a"], env=dtask_env, cwd=REPO, capture_output=True,
            text=True, timeout=60, check=True,
        ).stdout.strip()  # fmt: skip
        for headers, raw in receiver.got:
            expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
            assert headers["X-Dtask-Signature"] == expected
            sent = json.loads(raw)
            assert (sent["id"], sent["state"]) == (run["id"], "succeeded")
        assert len(receiver.got) == 2  # delivered: not sent again
        bad = call(api, "POST", "/runs", tokens["a"], {**body, "notify_url": "ftp://x/y"})
        assert bad.status == 422 and "notify_url must be an http(s) URL" in bad.body["error"]
    finally:
        receiver.close()


def test_a_run_submitted_after_others_over_http_waits_and_names_them(
    api: str, tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    a, b = tokens["a"], tokens["b"]
    slow = {"template": "slow_range", "variables": {"n": 20, "delay": 0.1}}
    up = call(api, "POST", "/runs", a, {**slow, "key": f"api-up-{time.time()}"})
    assert up.status == 201, up.body
    after = {"template": "print_range", "variables": {"n": 3}}
    down = call(api, "POST", "/runs", a, {**after, "after_keys": [up.body["key"]]})
    assert down.status == 201, down.body
    assert (down.body["state"], down.body["after"]) == ("waiting", [up.body["id"]])
    assert down.body["waiting_for"] == [up.body["id"]]
    before = run_count()
    for body in ({"after": [987654321]}, {"after_keys": ["no-such-key"]}, {"after": ["x"]}):
        refused = call(api, "POST", "/runs", a, {**after, **body})
        assert refused.status == 422, refused.body
    theirs = call(api, "POST", "/runs", b, {**after, "after": [up.body["id"]]})
    assert theirs.status == 422, theirs.body
    assert theirs.body["error"] == f"after: no run {up.body['id']} (by id or trigger key) of yours"
    by_key = call(api, "POST", "/runs", b, {**after, "after_keys": [up.body["key"]]})
    assert (
        by_key.body["error"] == f"after: no run {up.body['key']!r} (by id or trigger key) of yours"
    )
    assert run_count() == before
    read = call(api, "GET", f"/runs/{down.body['id']}", a).body
    assert read["waiting_reason"] == "upstream"
    assert read["waiting_because"].startswith(f"waits for run {up.body['id']} (")
    done = call(api, "GET", f"/runs/{down.body['id']}?wait=120", a)
    assert (done.body["state"], done.body["waiting_for"]) == ("succeeded", [])
    assert (done.body["waiting_because"], done.body["waiting_reason"]) == (None, None)


def test_a_batch_submit_answers_each_run_s_outcome_in_order(
    api: str, tokens: dict[str, str]
) -> None:
    stamp = f"batch-{time.time()}"
    runs = [
        {"variables": {"n": 3}, "key": f"{stamp}-1"},
        {"variables": {"n": "x"}},
        {"variables": {"n": 3}, "key": f"{stamp}-1"},
        {"variables": {"n": 4}},
    ]
    before = run_count()
    reply = call(api, "POST", "/runs/batch", tokens["a"], {"template": "print_range", "runs": runs})
    assert reply.status == 200, reply.body
    assert [r["outcome"] for r in reply.body["runs"]] == [
        "created", "invalid", "known_key", "created",
    ]  # fmt: skip
    assert reply.body["runs"][2]["run_id"] == reply.body["runs"][0]["run_id"]
    assert "'n' must be int" in reply.body["runs"][1]["error"]
    assert (reply.body["created"], reply.body["invalid"], reply.body["known_key"]) == (2, 1, 1)
    assert run_count() == before + 2
    first = call(api, "GET", f"/runs/{reply.body['runs'][0]['run_id']}", tokens["a"], None)
    assert first.body["client"] == "api-a"
    assert call(api, "GET", f"/runs/{reply.body['runs'][0]['run_id']}", tokens["b"]).status == 404

    limited = call(api, "POST", "/runs/batch", tokens["limited"],
                   {"template": "print_range", "runs": [{"variables": {"n": 1}}] * 3})  # fmt: skip
    outcomes = [r["outcome"] for r in limited.body["runs"]]
    assert outcomes.count("limit_exceeded") >= 2 and "created" not in outcomes[1:]
    assert all(r["retry_after"] > 0 for r in limited.body["runs"] if "retry_after" in r)

    other = call(api, "POST", "/runs/batch", tokens["a"],
                 {"template": "print_range", "client": "api-b", "runs": []})  # fmt: skip
    assert other.status == 403
    many = {"template": "print_range", "runs": [{"variables": {"n": 1}}] * 1001}
    too_many = call(api, "POST", "/runs/batch", tokens["a"], many)
    assert too_many.status == 422 and run_count() == before + 2 + outcomes.count("created")


def test_a_submit_past_the_backlog_cap_is_503_busy_with_retry_after(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    import dtask

    dtask.set_client("api-busy")
    busy_token = token(dtask_env, "api-busy")
    env = {**dtask_env, "DTASK_MAX_CLIENT_BACKLOG": "1"}
    server, base = start_server(env, tmp_path / "serve.log")
    try:
        new = {"template": "print_range", "variables": {"n": 3}}
        assert call(base, "POST", "/runs", busy_token, new).status == 201
        before = run_count()
        refused = call(base, "POST", "/runs", busy_token, new)
        assert refused.status == 503, refused.body
        assert refused.body["error"].startswith("busy: client 'api-busy' has 1 unfinished run (")
        assert refused.body["retry_after"] > 0
        assert int(refused.headers["retry-after"]) == math.ceil(refused.body["retry_after"])
        two = {"template": "print_range", "runs": [{"variables": {"n": 1}}] * 2}
        batch = call(base, "POST", "/runs/batch", busy_token, two)
        assert [r["outcome"] for r in batch.body["runs"]] == ["busy", "busy"]
        assert batch.body["busy"] == 2 and run_count() == before
    finally:
        server.stop()
