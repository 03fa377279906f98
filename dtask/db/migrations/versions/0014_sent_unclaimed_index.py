"""the dispatcher counts each running run's sent and unclaimed children through a small index

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_dtask_children_run_id",
        "dtask_children",
        ["run_id"],
        postgresql_where=sa.text("state = 'pending' AND sent_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_children_run_id", table_name="dtask_children")
