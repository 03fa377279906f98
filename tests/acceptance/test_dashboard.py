"""The dashboard in a real headless Chromium against a real `dtask serve`, real PostgreSQL and
workers: log in, submit from the page, watch the progress bar reach 100 %, open a failed
child's error, cancel a run, see a killed worker's alert appear; a 100,000-child grid.

`DTASK_SCREENSHOTS=docs/screenshots pytest tests/acceptance/test_dashboard.py` saves the
pages the README shows."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from dtask import services
from tests.conftest import WorkerProcess
from tests.support.api import call, start_server, token
from tests.support.browser import browser

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.acceptance
WAIT = 90_000  # ms: generous, the machine may be busy
SHOTS = os.environ.get("DTASK_SCREENSHOTS")


def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def site(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    server, base = start_server(dtask_env, tmp_path_factory.mktemp("ui") / "serve.log")
    try:
        yield base.removesuffix("/api/v1"), base
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tokens(dtask_env: dict[str, str]) -> dict[str, str]:
    import dtask

    dtask.set_client("ui-a", rate="1000/m", max_running=50)
    dtask.set_client("ui-b")
    return {
        "a": token(dtask_env, "ui-a"),
        "b": token(dtask_env, "ui-b"),
        "admin": token(dtask_env, "default", "--admin"),
    }


@pytest.fixture
def page(site: tuple[str, str]) -> Iterator[Page]:
    with browser() as chromium:
        opened = chromium.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        opened.on("pageerror", lambda e: errors.append(str(e)))
        opened.on(
            "console", lambda m: errors.append(m.text) if "Content Security" in m.text else None
        )
        opened.goto(site[0] + "/")
        yield opened
        assert errors == [], errors  # no script error, nothing the page's CSP refused


def log_in(page: Page, secret: str) -> None:
    page.fill("#token", secret)
    page.click("#login-form button")
    page.wait_for_selector("#login", state="hidden", timeout=WAIT)


def test_log_in_submit_from_the_page_and_watch_the_run_finish(
    page: Page, tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    page.fill("#token", "dtk_not-a-token")
    page.click("#login-form button")
    page.wait_for_selector("#login-error:has-text('refused')", timeout=WAIT)
    log_in(page, tokens["a"])
    assert page.inner_text("#who") == "ui-a"

    page.select_option("#submit-template", "slow_range")
    page.fill("#submit-variables", '{"n": 400, "delay": 0.01}')
    page.click("#submit-form button")
    page.wait_for_url("**/#/runs/*", timeout=WAIT)
    run_id = int(page.url.rsplit("/", 1)[1])
    page.wait_for_selector("#grid[data-drawn='20']", timeout=WAIT)  # 400 items, 20 a child
    seen: set[int] = set()
    deadline = time.monotonic() + WAIT / 1000
    while 100 not in seen and time.monotonic() < deadline:
        pct = page.get_attribute("#run [data-pct]", "data-pct")
        if pct is not None:
            seen.add(int(pct))
        page.wait_for_timeout(200)
    assert 100 in seen, f"the progress bar never reached 100 % (saw {sorted(seen)})"
    page.wait_for_selector("#run-state .state.succeeded", timeout=WAIT)
    shot(page, "run")

    page.goto(page.url.split("#")[0] + "#/runs")
    row = page.wait_for_selector(f"#runs tr[data-run='{run_id}']", timeout=WAIT)
    assert row is not None and "succeeded" in row.inner_text()
    assert "100 %" in row.inner_text()
    shot(page, "runs")


EVIL = '<img src=x onerror="window.owned=1"><script>window.owned=2</script>'


def test_a_client_s_html_is_shown_as_text_never_run(
    page: Page, site: tuple[str, str], tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    """A trigger key and variables holding markup, shown on the runs list and the run page:
    as the text they are, and no script of theirs runs (docs/security.md, "Threat model")."""
    submit = {"template": "slow_range", "variables": {"n": 1, "delay": 0}, "key": EVIL}
    made = call(site[1], "POST", "/runs", tokens["a"], submit)
    assert made.status == 201, made.body
    log_in(page, tokens["a"])
    page.goto(f"{site[0]}/#/runs")
    row = page.wait_for_selector(f"#runs tr[data-run='{made.body['id']}']", timeout=WAIT)
    assert row is not None and f"key {EVIL}" in row.inner_text()
    page.goto(f"{site[0]}/#/runs/{made.body['id']}")
    page.wait_for_selector("#run-state .state", timeout=WAIT)
    assert f"key {EVIL}" in page.inner_text("#run")
    assert page.locator("#run img, #runs img").count() == 0
    assert page.evaluate("window.owned") is None


def test_a_failed_child_s_error_and_cancel_from_the_run_page(
    page: Page, site: tuple[str, str], tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    a = tokens["a"]
    fails = {"template": "always_fails", "variables": {"n": 30, "bad": 15}}
    failing = call(site[1], "POST", "/runs", a, fails).body
    log_in(page, a)
    page.goto(f"{site[0]}/#/runs/{failing['id']}")
    page.wait_for_selector("#run-state .state.failed", timeout=WAIT)
    # locators, not elements: two refreshes may each draw the failed children
    child = page.locator(".failed-child[data-index='1']")
    child.wait_for(timeout=WAIT)
    assert "item 15 is poison" in child.inner_text()
    full = child.locator("pre.error")
    assert not full.is_visible()
    child.click()
    assert full.is_visible() and "ValueError" in full.inner_text()
    third = page.locator("#child-logs .attempt[data-attempt='3'][data-state='failed']")
    third.wait_for(timeout=WAIT)  # the click shows the child's attempts
    assert "checking 11..20 (attempt 3)" in third.inner_text()
    assert page.locator("#child-logs .attempt").count() == 3
    shot(page, "child-logs")
    assert page.is_enabled("#rerun") and not page.is_enabled("#cancel")
    shot(page, "failed-run")
    page.fill("#log-child", "0")
    page.click("#log-form button")
    page.locator("#child-logs .attempt[data-state='succeeded']").wait_for(timeout=WAIT)
    assert "checking 1..10 (attempt 1)" in page.inner_text("#child-logs")

    long = {"template": "slow_range", "variables": {"n": 4000, "delay": 0.05}}
    slow = call(site[1], "POST", "/runs", a, long).body
    after = {"template": "print_range", "variables": {"n": 3}, "after": [slow["id"]]}
    waiting = call(site[1], "POST", "/runs", a, after).body
    page.goto(f"{site[0]}/#/runs/{waiting['id']}")
    page.wait_for_selector("#run-state .state.waiting", timeout=WAIT)
    # a locator, not an element: the page draws #run-after again on every refresh
    upstream = page.locator(f"#run-after a.waiting-for[href='#/runs/{slow['id']}']")
    upstream.wait_for(timeout=WAIT)
    assert upstream.inner_text() == f"#{slow['id']}"
    assert "waiting for 1 upstream run(s)" in page.inner_text("body")
    why = page.locator("#run-why[data-reason='upstream']")
    why.wait_for(timeout=WAIT)
    assert f"Why it waits: waits for run {slow['id']} (" in why.inner_text()  # its state
    shot(page, "why-it-waits")
    upstream.click()
    page.wait_for_selector("#run-state .state.running", timeout=WAIT)
    assert page.is_enabled("#cancel")
    page.click("#terminate")  # the cancel that stops a hung child (test_execution_cap)
    page.wait_for_selector("#run-state .state.cancelled", timeout=WAIT)
    assert call(site[1], "GET", f"/runs/{slow['id']}", a).body["state"] == "cancelled"
    assert services.store().runs.terminating(slow["id"])
    page.goto(f"{site[0]}/#/runs/{waiting['id']}")
    page.wait_for_selector("#run-state .state.failed", timeout=WAIT)
    assert f"upstream run {slow['id']} was cancelled" in page.inner_text("#run-error")


def test_another_client_s_runs_are_not_on_its_page(
    page: Page, site: tuple[str, str], tokens: dict[str, str]
) -> None:
    body = {"template": "print_range", "variables": {"n": 5}}
    mine = call(site[1], "POST", "/runs", tokens["a"], body).body
    log_in(page, tokens["b"])
    page.wait_for_selector("body[data-refreshed]", timeout=WAIT)
    assert page.query_selector(f"#runs tr[data-run='{mine['id']}']") is None
    page.goto(f"{site[0]}/#/runs/{mine['id']}")
    missing = page.wait_for_selector("#run-missing", timeout=WAIT)
    assert missing is not None and missing.inner_text() == f"no run with id {mine['id']}"


def test_a_killed_worker_s_alert_appears_on_the_page(
    page: Page, dtask_env: dict[str, str], tokens: dict[str, str], tmp_path: Path
) -> None:
    name = f"doomed-{os.getpid()}-{int(time.time())}@test"
    doomed = WorkerProcess(dtask_env, tmp_path / "doomed.log", "-c", "1", "--hostname", name)
    try:
        doomed.wait_ready()
        log_in(page, tokens["admin"])
        page.goto(page.url.split("#")[0] + "#/workers")
        page.wait_for_selector(f"#workers tr[data-worker='{name}']", timeout=WAIT)
        shot(page, "workers")
        doomed.kill()
        alert = page.wait_for_selector(
            f"#alerts .alert[data-kind='worker_lost'][data-subject='{name}']", timeout=WAIT
        )
        assert alert is not None and "stopped reporting" in alert.inner_text()
        shot(page, "alert")
        page.wait_for_selector(f"#workers tr[data-worker='{name}']", state="detached", timeout=WAIT)
    finally:
        doomed.stop()


def test_a_run_of_100000_children_draws_as_one_grid(
    page: Page, site: tuple[str, str], tokens: dict[str, str], workers: list[WorkerProcess]
) -> None:
    admin = tokens["admin"]
    body = {"template": "slow_range", "variables": {"n": 2_000_000, "delay": 0.0}}
    run = call(site[1], "POST", "/runs", admin, body).body
    try:
        log_in(page, admin)
        page.goto(f"{site[0]}/#/runs/{run['id']}")
        page.wait_for_selector("#grid[data-drawn='100000']", timeout=WAIT * 2)
        started = time.monotonic()
        grid = call(site[1], "GET", f"/runs/{run['id']}/grid", admin).body
        took = time.monotonic() - started
        print(f"\nthe grid of 100,000 children: {len(grid['runs'])} runs, {took * 1000:.0f} ms")
        assert grid["total"] == 100_000
        assert sum(n for _, n in grid["runs"]) == 100_000
        shot(page, "grid-100k")
    finally:
        call(site[1], "POST", f"/runs/{run['id']}/cancel", admin)


def test_schedules_with_their_next_five_slots_and_clients_with_their_limits(
    page: Page, site: tuple[str, str], tokens: dict[str, str]
) -> None:
    admin, name = tokens["admin"], f"ui-nightly-{int(time.time())}"
    body = {"template": "print_range", "variables": {"n": 5}, "cron": "0 3 * * *", "tz": "UTC"}
    assert call(site[1], "PUT", f"/schedules/{name}", admin, body).status == 201
    try:
        log_in(page, admin)
        page.goto(f"{site[0]}/#/schedules")
        row = page.wait_for_selector(f"#schedules tr[data-schedule='{name}']", timeout=WAIT)
        assert row is not None and "cron 0 3 * * * (UTC)" in row.inner_text()
        assert len(row.query_selector_all("td:nth-child(5) div")) == 5  # the next five slots
        shot(page, "schedules")
        page.goto(f"{site[0]}/#/clients")
        client = page.wait_for_selector("#clients tr[data-client='ui-a']", timeout=WAIT)
        assert client is not None and "1000/m" in client.inner_text()
        shot(page, "clients")
    finally:
        call(site[1], "DELETE", f"/schedules/{name}", admin)

    page.click("#logout")
    log_in(page, tokens["b"])  # not an admin: told so, shown nothing
    page.goto(f"{site[0]}/#/clients")
    page.wait_for_selector("#view p:has-text('Only an admin token')", timeout=WAIT)
