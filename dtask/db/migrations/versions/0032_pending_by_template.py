"""pending runs by template and priority: a one-child run's master takes the pending runs of
its template and priority with it (``InlineStore.split_many``'s siblings), oldest first,
without reading every active run; and a single submit's run that waits for a pickup to send
its master (``awaits_pickup``, dtask/worker/pickup.py), read the highest priority and oldest
first

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
    op.add_column(
        "dtask_runs",
        sa.Column("awaits_pickup", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.create_index(
        "ix_dtask_runs_awaits_pickup",
        "dtask_runs",
        [sa.text("priority DESC"), "id"],
        postgresql_where=sa.text("state = 'pending' AND awaits_pickup"),
    )
    op.create_index(
        "ix_dtask_runs_pending_template",
        "dtask_runs",
        ["template", "priority", "id"],
        postgresql_where=sa.text("state = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_pending_template", "dtask_runs")
    op.drop_index("ix_dtask_runs_awaits_pickup", "dtask_runs")
    op.drop_column("dtask_runs", "awaits_pickup")
