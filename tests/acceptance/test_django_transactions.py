"""Issue 36, items 5 and 6, in the Django project (tests/django_project), whose PostgreSQL is
dtask's too: a submit tied to the caller's transaction (``delay_on_commit``, ``submit(...,
using="default")``) leaves no run when it rolls back and runs to the end when it commits; and
the project's own test runner in test mode (proj/test_settings.py) runs templates in the test,
against its test database, with no broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.support.db import wait_for
from tests.support.django import Celery, django_env, manage, python

pytestmark = pytest.mark.acceptance
# the embedded Redis database this file's broker uses (dtask.services.embedded starts 64)
VHOST = 40


_FLOOR = [0]  # the highest run id before this file's first test: runs of other files are older


@pytest.fixture(scope="module")
def env(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    with services.store().db.tx() as conn:
        _FLOOR[0] = int(conn.execute(text("SELECT coalesce(max(id), 0) FROM dtask_runs")).scalar())
    home = tmp_path_factory.mktemp("django-tx-home")
    project = {**django_env(dtask_env, VHOST), "HOME": str(home)}
    migrated = manage(project, "migrate")
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return project


@pytest.fixture(scope="module")
def worker(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    log = tmp_path_factory.mktemp("django-tx") / "worker.log"
    process = Celery(
        env, log, "worker", "-l", "INFO", "--without-mingle", "--without-gossip", "-c", "2"
    )
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def _runs(n: int) -> list[dict[str, Any]]:
    """This file's runs of report_range with variable n (each test uses n values of its own;
    another file's tests submit report_range too)."""
    with services.store().db.tx() as conn:
        rows = conn.execute(
            text(
                "SELECT id, state, result FROM dtask_runs WHERE template = 'report_range'"
                " AND variables->>'n' = :n AND id > :floor ORDER BY id"
            ),
            {"n": str(n), "floor": _FLOOR[0]},
        ).all()
    return [{"id": r.id, "state": r.state, "result": r.result} for r in rows]


def _in_django(env: dict[str, str], code: str) -> dict[str, Any]:
    """Run ``code`` in the project's process (django.setup() done); the JSON it prints last."""
    done = python(env, "import django\ndjango.setup()\n" + code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


ROLLED_BACK = """
import json
from django.db import transaction
import dtask
from reports.templates import report_range

class Undone(Exception):
    pass

try:
    with transaction.atomic():
        report_range.delay_on_commit(n=5, delay=0)
        run = dtask.submit("report_range", {"n": 6, "delay": 0}, using="default")
        inside = run.id
        raise Undone
except Undone:
    pass
later = report_range.delay(n=4, delay=0)  # committed after them: its run goes through
print(json.dumps({"inside": inside, "later": later.id}))
"""

COMMITTED = """
import json
from django.db import connection, transaction
import dtask
from reports.templates import report_range

with transaction.atomic():
    report_range.delay_on_commit(n=7, delay=0)
    run = dtask.submit("report_range", {"n": 8, "delay": 0}, key="tx-committed", using="default")
    again = dtask.submit("report_range", {"n": 8, "delay": 0}, key="tx-committed", using="default")
    assert (again.id, again.created) == (run.id, False), (again.id, run.id)
    dtask.submit("report_range", {"n": 10, "delay": 0}, connection=connection)  # Django's
report_range.delay_on_commit(n=9, delay=0)  # outside a transaction: at once, as Celery's
print(json.dumps({"run": run.id}))
"""


def test_a_rolled_back_transaction_leaves_no_run_and_sends_nothing(
    env: dict[str, str], worker: Celery
) -> None:
    seen = _in_django(env, ROLLED_BACK)
    assert _runs(5) == [] and _runs(6) == []
    with pytest.raises(dtask.RunNotFound):
        dtask.get_run(seen["inside"])
    # a run submitted after them finishes, and no master of theirs reached the worker
    assert dtask.get_run(seen["later"]).get(timeout=90) == 10
    assert _runs(5) == [] and _runs(6) == []
    assert f"run {seen['inside']} " not in worker.output()


def test_a_committed_transaction_s_runs_run_to_the_end(env: dict[str, str], worker: Celery) -> None:
    seen = _in_django(env, COMMITTED)
    wait_for(lambda: all(len(_runs(n)) == 1 for n in (7, 9, 10)), 30, "the committed runs")
    ids = [_runs(7)[0]["id"], seen["run"], _runs(9)[0]["id"], _runs(10)[0]["id"]]
    assert [r["id"] for r in _runs(8)] == [seen["run"]]  # its key once, in the transaction too
    results = [dtask.get_run(i).get(timeout=90) for i in ids]
    assert results == [28, 36, 45, 55]


ASYNC = """
import asyncio, json
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.signals import connection_created
import dtask

opened = []  # each new Django connection of this process: its alias
connection_created.connect(lambda connection, **_: opened.append(connection.alias), weak=False)

def in_django(name, *args):  # where an async view's sync calls run: its connection's thread
    return sync_to_async(lambda: getattr(connection, name)(*args), thread_sensitive=True)()

async def view():
    await in_django("ensure_connection")  # the view has read the database
    run = await dtask.asubmit("report_range", {"n": 11, "delay": 0}, using="default")
    other = await dtask.asubmit("report_range", {"n": 12, "delay": 0}, connection=connection)
    return run.id, other.id

run, other = asyncio.run(view())
print(json.dumps({"run": run, "other": other, "opened": opened}))
"""


def test_asubmit_on_django_s_connection_from_an_async_view(
    env: dict[str, str], worker: Celery
) -> None:
    """``await dtask.asubmit(..., using=...)`` (or a Django ``connection=``) in an async view
    writes on the connection Django's own sync calls use, in their thread: it opens none of
    its own (before: each submit thread opened one, never closed)."""
    seen = _in_django(env, ASYNC)
    assert seen["opened"] == ["default"]
    assert [dtask.get_run(seen[k]).get(timeout=90) for k in ("run", "other")] == [66, 78]


KEYED = """
import json
from django.db import transaction
import dtask

key = dict(concurrency_key="django-export", max_concurrent=1)
ids = []
with transaction.atomic():  # the team's view: two exports in its transaction
    for n in (13, 14):
        run = dtask.submit("report_range", {"n": n, "delay": 0.03}, using="default", **key)
        ids.append(run.id)
ids.append(dtask.submit("report_range", {"n": 15, "delay": 0.03}, **key).id)
print(json.dumps({"ids": ids}))
"""


def test_a_concurrency_key_holds_in_the_django_project(env: dict[str, str], worker: Celery) -> None:
    """Runs of one concurrency key submitted from the project (two in its transaction, one
    after) run one at a time on its plain `celery -A proj worker`, each after the one before."""
    seen = _in_django(env, KEYED)
    results = [dtask.get_run(i).get(timeout=120) for i in seen["ids"]]
    assert results == [91, 105, 120]
    with services.store().db.tx() as conn:
        spans = conn.execute(
            text("SELECT started_at, finished_at FROM dtask_runs WHERE id = ANY(:ids) ORDER BY id"),
            {"ids": seen["ids"]},
        ).all()
    for before, after in pairwise(spans):
        assert after.started_at >= before.finished_at, spans


@pytest.mark.parametrize("switch", ["dtask", "celery"])
def test_the_project_s_tests_run_templates_in_test_mode(env: dict[str, str], switch: str) -> None:
    """`manage.py test` with CELERY_DTASK_EAGER (or Celery's CELERY_TASK_ALWAYS_EAGER) in its
    test settings: reports/tests.py's runs finish inside each test, in the test database, with
    no broker at all (test_settings.py points it at a closed port) and no worker; dtask's own
    database gets none of them."""
    before = len(_runs(25))
    done = manage(
        {**env, "PROJ_EAGER": switch}, "test", "reports", "--settings=proj.test_settings",
        "--noinput", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert "Ran 4 tests" in done.stderr and "OK" in done.stderr, done.stderr[-3000:]
    assert len(_runs(25)) == before  # the real database saw none of the test's runs
