"""every stored moment is one psycopg and Python can read

A delay tolerance of 1e12 seconds stored a deadline in the year 33715. PostgreSQL holds it;
psycopg cannot read a timestamp past 9999, so every statement that selected the deadline
failed: the dispatcher's pass (for every client), `dtask runs`, `GET /runs`, cancel. Inputs
are now bounded where they enter (durations at most ten years, moments between 1970 and 8999:
docs/security.md); this carries rows stored before over (durations cut to ten years, their
deadlines recomputed from them; an eta past 8999 brought back to it), and makes PostgreSQL
refuse any moment past the readable range, so a value that slips past a check one day fails
its own insert instead of every later read.

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

MOST = 10 * 365 * 86400  # dtask.domain.limits.MAX_SECONDS
LATEST = "'9000-01-01 00:00:00+00'"  # dtask.domain.limits.LATEST
READABLE = "'9999-01-01 00:00:00+00'"  # psycopg reads up to 9999 in any session time zone
CHECKS = {
    "dtask_runs": ("deadline", "start_after", "slot"),
    "dtask_schedules": ("next_due_at", "decided_until", "start_at", "end_at"),
}


def upgrade() -> None:
    op.execute(f"UPDATE dtask_runs SET start_after = {LATEST} WHERE start_after > {LATEST}")
    op.execute(
        f"UPDATE dtask_runs SET delay_tolerance = least(delay_tolerance, {MOST}),"
        " deadline = coalesce(slot, start_after, created_at)"
        f" + make_interval(secs => least(delay_tolerance, {MOST}))"
        f" WHERE delay_tolerance > {MOST} OR deadline >= {READABLE}"
    )
    op.execute(f"UPDATE dtask_runs SET execution_cap = {MOST} WHERE execution_cap > {MOST}")
    op.execute(
        f"UPDATE dtask_schedules SET delay_tolerance = {MOST} WHERE delay_tolerance > {MOST}"
    )
    for table, columns in CHECKS.items():
        for column in columns:
            op.create_check_constraint(
                op.f(f"ck_{table}_{column}_readable"), table, f"{column} < {READABLE}"
            )


def downgrade() -> None:
    for table, columns in CHECKS.items():
        for column in columns:
            op.drop_constraint(op.f(f"ck_{table}_{column}_readable"), table, type_="check")
