"""the dispatcher reads only the head of each client's waiting runs, through an index in the
order it sends them (per client, queue and template: priority, deadline, id)

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_dtask_runs_dispatch_order",
        "dtask_runs",
        [
            "client",
            sa.text("coalesce(queue, '')"),
            "template",
            sa.text("priority DESC"),
            "deadline",
            "id",
        ],
        postgresql_where=sa.text("unsent > 0 AND state = 'running'"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_dispatch_order", table_name="dtask_runs")
