"""pending runs by template and priority: a one-child run's master takes the pending runs of
its template and priority with it (``InlineStore.split_many``'s siblings), oldest first,
without reading every active run

Revision ID: 0032
Revises: 0031
"""

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_dtask_runs_pending_template",
        "dtask_runs",
        ["template", "priority", "id"],
        postgresql_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_pending_template", "dtask_runs")
