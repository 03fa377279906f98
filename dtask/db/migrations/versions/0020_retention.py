"""retention: finished runs by when they finished (the pruner's scan)

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_dtask_runs_finished_at",
        "dtask_runs",
        ["finished_at"],
        postgresql_where=sa.text("state IN ('succeeded', 'failed', 'cancelled')"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_finished_at", "dtask_runs")
