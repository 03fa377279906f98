"""Clients and rate limits from the outside: `dtask client ...`, and submitters in several
processes hammering one limited client."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

import dtask
from dtask import services
from tests.conftest import DTASK, REPO

pytestmark = pytest.mark.acceptance

HAMMER = """
import json, sys, time
import dtask
client, seconds = sys.argv[1], float(sys.argv[2])
created, refused, other = [], 0, []

def attempt():
    global refused
    try:
        created.append(dtask.submit("flaky_range", {"n": 1, "fail_at": 0}, client=client).id)
    except dtask.RateLimited as exc:
        refused += 1
        assert "limit exceeded" in str(exc) and exc.retry_after > 0, exc
    except Exception as exc:
        other.append(repr(exc))

attempt()  # the first, with its imports and connections, before the clock starts
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    attempt()
print(json.dumps({"created": created, "refused": refused, "other": other}))
"""


def dtask_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_four_processes_against_50_a_minute_create_exactly_50(dtask_env: dict[str, str]) -> None:
    services.ensure_broker()
    client = f"acme-{uuid.uuid4().hex[:8]}"
    made = dtask_cli(dtask_env, "client", "set", client, "--rate", "50/m", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["rate"] == "50/m"
    hammers = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, client, "10"],
            env=dtask_env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = []
    for hammer in hammers:
        out, err = hammer.communicate(timeout=180)
        assert hammer.returncode == 0, err
        results.append(json.loads(out))
    try:
        created = [run_id for r in results for run_id in r["created"]]
        print(f"\ncreated {len(created)}, refused {sum(r['refused'] for r in results)}")
        assert [o for r in results for o in r["other"]] == []
        assert len(created) == 50 and sum(r["refused"] for r in results) > 0
        listed = services.store().runs.statuses(limit=1000, client=client)
        assert sorted(s.id for s in listed) == sorted(created)  # nothing half-created

        refused = dtask_cli(
            dtask_env, "submit", "flaky_range", "-e", "n=1", "-e", "fail_at=0", "--client", client
        )
        assert refused.returncode == 4
        assert refused.stdout == "" and len(refused.stderr.splitlines()) == 1
        assert "limit exceeded" in refused.stderr and "retry in" in refused.stderr
        shown = json.loads(dtask_cli(dtask_env, "client", "show", client, "--json").stdout)
        assert shown["usage"]["runs_in_window"] == 50
    finally:
        for r in results:
            for run_id in r["created"]:
                dtask.get_run(run_id).cancel()  # no worker picks these up later


def test_client_commands_take_bad_input_in_one_line(dtask_env: dict[str, str]) -> None:
    for argv, message in [
        (("client", "set", "x", "--rate", "50/min"), "N/PERIOD"),
        (("client", "set", "x", "--max-running", "two"), "--max-running expects a whole number"),
        (("client", "set", "bad name"), "client name 'bad name'"),
        (("client", "show", "nobody-here"), "no client named 'nobody-here'"),
        (("submit", "flaky_range", "-e", "n=1", "-e", "fail_at=0", "--client", "nobody-here"),
         "create it with `dtask client set nobody-here`"),
        (("submit", "flaky_range", "-e", "n=1", "-e", "fail_at=0", "--priority", "12"),
         "priority must be a whole number from 0"),
    ]:  # fmt: skip
        result = dtask_cli(dtask_env, *argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr
    assert dtask_cli(dtask_env, "client", "show", "x").returncode == 2  # nothing was saved
