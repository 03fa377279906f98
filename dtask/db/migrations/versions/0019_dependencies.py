"""dependencies between runs: a run waits for its upstreams (state waiting); a schedule's slots
wait for another schedule's

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_STATES = "'waiting', 'pending', 'splitting', 'running', 'succeeded', 'failed', 'cancelled'"
_OLD_STATES = "'pending', 'splitting', 'running', 'succeeded', 'failed', 'cancelled'"


def upgrade() -> None:
    op.create_table(
        "dtask_run_deps",
        sa.Column("run_id", sa.BigInteger, nullable=False),
        sa.Column("upstream_id", sa.BigInteger, nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["dtask_runs.id"], ondelete="CASCADE",
            name=op.f("fk_dtask_run_deps_run_id_dtask_runs"),
        ),
        sa.ForeignKeyConstraint(
            ["upstream_id"], ["dtask_runs.id"], ondelete="CASCADE",
            name=op.f("fk_dtask_run_deps_upstream_id_dtask_runs"),
        ),
        sa.PrimaryKeyConstraint("run_id", "upstream_id", name=op.f("pk_dtask_run_deps")),
    )  # fmt: skip
    op.create_index("ix_dtask_run_deps_upstream_id", "dtask_run_deps", ["upstream_id"])
    op.drop_constraint(op.f("ck_dtask_runs_state"), "dtask_runs", type_="check")
    op.create_check_constraint(op.f("ck_dtask_runs_state"), "dtask_runs", f"state IN ({_STATES})")
    op.create_index(
        "ix_dtask_runs_id_waiting",
        "dtask_runs",
        ["id"],
        postgresql_where=sa.text("state = 'waiting'"),
    )
    op.create_index(
        "ix_dtask_runs_schedule_slot",
        "dtask_runs",
        ["schedule", "slot"],
        postgresql_where=sa.text("schedule IS NOT NULL"),
    )
    op.add_column("dtask_schedules", sa.Column("after_schedule", sa.String(100)))


def downgrade() -> None:
    op.drop_column("dtask_schedules", "after_schedule")
    op.drop_index("ix_dtask_runs_schedule_slot", "dtask_runs")
    op.drop_index("ix_dtask_runs_id_waiting", "dtask_runs")
    op.execute("UPDATE dtask_runs SET state = 'pending' WHERE state = 'waiting'")
    op.drop_constraint(op.f("ck_dtask_runs_state"), "dtask_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_dtask_runs_state"), "dtask_runs", f"state IN ({_OLD_STATES})"
    )
    op.drop_table("dtask_run_deps")
