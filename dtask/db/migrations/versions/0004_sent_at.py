"""when each child's message and each stuck run's master were last sent (lost messages)

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_children",
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index(
        op.f("ix_dtask_children_sent_at"),
        "dtask_children",
        ["sent_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.add_column(
        "dtask_runs", sa.Column("master_sent_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("dtask_runs", "master_sent_at")
    op.drop_index(op.f("ix_dtask_children_sent_at"), table_name="dtask_children")
    op.drop_column("dtask_children", "sent_at")
