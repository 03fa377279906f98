"""The team's unit tests of its templates, run by Django's test runner in test mode
(proj/test_settings.py): each run executes in the test, against the test database."""

from django.db import connection
from django.test import TestCase

import dtask
from reports.models import Report
from reports.templates import report_range


@dtask.template(
    "report_rows",
    params={"n": int, "bad": int},
    skeleton={"start": 1, "end": "${n}", "bad": "${bad}"},
    split=dtask.RangeSplit("start", "end", chunk=2, carry=("bad",)),
    max_attempts=2,
)
def report_rows(ctx: dtask.ChildContext, a: int, b: int, bad: int) -> None:
    """Writes a Report per item through the ORM (on the test's connection, in its transaction)."""
    for i in range(a, b + 1):
        if i == bad:
            raise ValueError(f"report {i} cannot be made")
        Report.objects.create(name=f"row-{i}", value=i)


class ReportRangeTests(TestCase):
    def test_delay_returns_the_run_finished_with_its_result(self) -> None:
        run = report_range.delay(n=25, delay=0)
        self.assertEqual(run.state, dtask.RunState.SUCCEEDED)
        self.assertEqual(run.get(timeout=0), 325)
        status = run.status()
        self.assertEqual((status.children.total, status.children.succeeded), (3, 3))

    def test_the_run_is_in_the_test_database(self) -> None:
        run = report_range.delay(n=10, delay=0)
        self.assertTrue(connection.settings_dict["NAME"].startswith("test_"))
        with connection.cursor() as cursor:
            cursor.execute("SELECT state, result::text FROM dtask_runs WHERE id = %s", [run.id])
            self.assertEqual(cursor.fetchone(), ("succeeded", "55"))

    def test_a_failing_child_fails_the_run_with_its_error_after_its_attempts(self) -> None:
        run = report_rows.delay(n=4, bad=3)
        self.assertEqual(run.state, dtask.RunState.FAILED)
        with self.assertRaisesMessage(dtask.RunFailed, "report 3 cannot be made"):
            run.get(timeout=0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT attempt FROM dtask_children WHERE run_id = %s AND index = 1", [run.id]
            )
            self.assertEqual(cursor.fetchone(), (2,))
        # the children's ORM writes are the test's: the first child's, and none of the failed
        self.assertEqual(sorted(Report.objects.values_list("value", flat=True)), [1, 2])

    def test_invalid_variables_are_refused_as_without_test_mode(self) -> None:
        with self.assertRaises(dtask.InvalidVariables):
            report_range.delay(n="many", delay=0)
