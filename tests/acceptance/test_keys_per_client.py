"""Trigger keys belong to clients, over HTTP against a real `dtask serve` with two non-admin
tokens: another client's key is simply a new run of the caller's own, nothing answered to one
client tells whether another's key, run, template or variables exist, and /alerts names only
runs the token may see. No worker runs here: submitted runs stay pending (and stall at once:
DTASK_STALL_ALERT=1); every run is cancelled at the end."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dtask.domain.alerts import Scope, kinds_of
from tests.conftest import DTASK, REPO
from tests.support.api import call, start_server, token
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

A, B = f"keys-a-{uuid.uuid4().hex[:6]}", f"keys-b-{uuid.uuid4().hex[:6]}"
BODY = {"template": "print_range", "variables": {"n": 3}}
MISSING_ID = 987654321


@pytest.fixture(scope="module")
def tokens(dtask_env: dict[str, str]) -> dict[str, str]:
    import dtask

    dtask.set_client(A)
    dtask.set_client(B)
    return {
        "a": token(dtask_env, A),
        "b": token(dtask_env, B),
        "admin": token(dtask_env, "default", "--admin"),
    }


@pytest.fixture(scope="module")
def api(
    dtask_env: dict[str, str], tokens: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    env = {**dtask_env, "DTASK_STALL_ALERT": "1"}
    server, base = start_server(env, tmp_path_factory.mktemp("keys") / "serve.log")
    try:
        yield base
    finally:
        try:
            for client in (A, B):  # their masters wait in the broker: nothing left to run
                for run in call(base, "GET", f"/runs?client={client}&limit=1000",
                                tokens["admin"]).body["runs"]:  # fmt: skip
                    if run["state"] in ("pending", "waiting"):
                        call(base, "POST", f"/runs/{run['id']}/cancel", tokens["admin"])
        finally:
            server.stop()


def key() -> str:
    return f"keys-{uuid.uuid4()}"


def submit(api: str, secret: str, **body: Any) -> Any:
    return call(api, "POST", "/runs", secret, {**BODY, **body})


def same_error(reply: Any, named: object, missing: Any, absent: object) -> bool:
    """The two answers are the same but for the name each was asked about."""
    return bool(
        reply.status == missing.status
        and reply.body["error"].replace(str(named), "X")
        == missing.body["error"].replace(str(absent), "X")
    )


def test_another_client_s_key_is_a_new_run_of_the_caller_s_own(
    api: str, tokens: dict[str, str], dtask_env: dict[str, str]
) -> None:
    a, b = tokens["a"], tokens["b"]
    shared = key()
    theirs = submit(api, a, key=shared)
    assert theirs.status == 201, theirs.body
    mine = submit(api, b, key=shared)  # was 404 "no run with id N": a's run exists
    assert mine.status == 201, mine.body
    assert mine.body["id"] != theirs.body["id"]
    assert (mine.body["client"], mine.body["key"]) == (B, shared)
    again = submit(api, b, key=shared)
    assert (again.status, again.body["id"]) == (200, mine.body["id"])

    other = key()
    assert submit(api, a, key=other).status == 201
    # other variables under a's key: b's own new run, not a 409 saying what differs from a's
    differs = submit(api, b, key=other, variables={"n": 4})
    assert differs.status == 201, differs.body
    assert differs.body["variables"] == {"n": 4} and differs.body["client"] == B
    conflict = submit(api, b, key=other, variables={"n": 5})  # b's own key: b's own conflict
    assert conflict.status == 409 and f"run {differs.body['id']} " in conflict.body["error"]

    cli = subprocess.run(
        [DTASK, "submit", "print_range", "-e", "n=3", "--key", shared, "--client", "default"],
        env=dtask_env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    said = cli.stdout.split()  # "run N submitted"
    assert said[0] == "run" and said[2] == "submitted", cli.stdout
    assert int(said[1]) not in (theirs.body["id"], mine.body["id"])
    call(api, "POST", f"/runs/{said[1]}/cancel", tokens["admin"])


def test_another_client_cannot_take_a_key_first(api: str, tokens: dict[str, str]) -> None:
    a, b = tokens["a"], tokens["b"]
    next_key = key()
    first = submit(api, b, key=next_key)
    assert first.status == 201, first.body
    later = submit(api, a, key=next_key)  # was 404 "no run with id N", and a's run never existed
    assert later.status == 201, later.body
    assert later.body["id"] != first.body["id"] and later.body["client"] == A
    assert call(api, "GET", f"/runs/{later.body['id']}", a).body["key"] == next_key


def test_another_client_s_runs_and_keys_answer_as_ones_that_do_not_exist(
    api: str, tokens: dict[str, str]
) -> None:
    a, b, admin = tokens["a"], tokens["b"], tokens["admin"]
    shared, only_a = key(), key()
    theirs = submit(api, a, key=shared).body
    mine = submit(api, b, key=shared).body
    assert mine["id"] != theirs["id"]  # was 404: a's run exists under the key
    a_only = submit(api, a, key=only_a).body
    run_id = a_only["id"]

    for method, path in [
        ("GET", "/runs/{}"),
        ("POST", "/runs/{}/cancel"),
        ("POST", "/runs/{}/rerun"),
        ("GET", "/runs/{}/children"),
        ("GET", "/runs/{}/grid"),
    ]:
        foreign = call(api, method, path.format(run_id), b)
        missing = call(api, method, path.format(MISSING_ID), b)
        assert foreign.status == 404, (path, foreign.body)
        assert same_error(foreign, run_id, missing, MISSING_ID), (foreign.body, missing.body)

    by_id = submit(api, b, after=[run_id])
    no_id = submit(api, b, after=[MISSING_ID])
    assert by_id.status == 422 and same_error(by_id, run_id, no_id, MISSING_ID)
    by_key = submit(api, b, after_keys=[only_a])
    no_key = submit(api, b, after_keys=["keys-no-such-key"])
    assert by_key.status == 422 and same_error(by_key, only_a, no_key, "keys-no-such-key")

    # a key names the submitting client's run: b's own, never a's of the same key
    waits = submit(api, b, after_keys=[shared])
    assert waits.status == 201, waits.body
    assert (waits.body["after"], waits.body["client"]) == ([mine["id"]], B)
    for client, upstream in ((B, mine["id"]), (A, theirs["id"])):  # an admin: within the client
        on_behalf = submit(api, admin, after_keys=[shared], client=client)
        assert on_behalf.status == 201, on_behalf.body
        assert (on_behalf.body["after"], on_behalf.body["client"]) == ([upstream], client)
    assert call(api, "GET", f"/runs/{run_id}", a).body["state"] == "pending"  # untouched


def test_alerts_name_only_runs_the_token_may_see(api: str, tokens: dict[str, str]) -> None:
    a, b, admin = tokens["a"], tokens["b"], tokens["admin"]
    theirs = submit(api, a, key=key()).body  # no worker: it stalls
    mine = submit(api, b, key=key()).body

    def stalled(secret: str, run_id: int) -> bool:
        alerts = call(api, "GET", "/alerts", secret).body
        return ("run_stalled", str(run_id)) in {(x["kind"], x["subject"]) for x in alerts}

    wait_for(lambda: stalled(admin, theirs["id"]), 60, "a's run's stalled alert")
    wait_for(lambda: stalled(b, mine["id"]), 60, "b's own run's stalled alert")
    assert stalled(a, theirs["id"]) and not stalled(a, mine["id"])
    seen_by_b = call(api, "GET", "/alerts", b).body
    assert not [x for x in seen_by_b if str(theirs["id"]) in (x["subject"], x["message"])]
    for alert in seen_by_b:  # a run of its own, or the cluster's (a worker), nothing else
        if alert["kind"].startswith("run_"):
            assert call(api, "GET", f"/runs/{alert['subject']}", b).status == 200, alert
        else:
            assert alert["kind"] in kinds_of(Scope.CLUSTER), alert
