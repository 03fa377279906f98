"""concurrency keys: a run's key (rendered from its variables) and how many unfinished runs of
its client may share it; one index serves both the count of a key's unfinished runs and the
read of its waiting ones, oldest first (dtask.db.concurrency)

Revision ID: 0036
Revises: 0035
"""

import sqlalchemy as sa
from alembic import op

revision = "0036"
down_revision = "0035"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("concurrency_key", sa.String(200), nullable=True))
    op.add_column("dtask_runs", sa.Column("max_concurrent", sa.Integer(), nullable=True))
    op.create_index(
        "ix_dtask_runs_concurrency",
        "dtask_runs",
        ["client", "concurrency_key", "id"],
        postgresql_where=sa.text("concurrency_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_concurrency", "dtask_runs")
    op.drop_column("dtask_runs", "max_concurrent")
    op.drop_column("dtask_runs", "concurrency_key")
