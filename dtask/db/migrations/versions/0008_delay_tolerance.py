"""delay tolerance: a run's deadline to start, what to do when late, and whether it was

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("delay_tolerance", sa.Float(), nullable=True))
    op.add_column("dtask_runs", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "dtask_runs", sa.Column("on_late", sa.String(8), server_default="run", nullable=False)
    )
    op.add_column("dtask_runs", sa.Column("late", sa.Boolean(), nullable=True))
    op.create_check_constraint("ck_dtask_runs_on_late", "dtask_runs", "on_late IN ('run', 'fail')")
    op.create_index(
        "ix_dtask_runs_deadline",
        "dtask_runs",
        ["deadline"],
        postgresql_where=sa.text("late IS NULL AND deadline IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_deadline", table_name="dtask_runs")
    op.drop_constraint("ck_dtask_runs_on_late", "dtask_runs", type_="check")
    for column in ("late", "on_late", "deadline", "delay_tolerance"):
        op.drop_column("dtask_runs", column)
