"""schedules: when each must be decided next, so a beat pass reads only the due ones

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_schedules",
        sa.Column(
            "next_due_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
    )
    op.create_index(
        "ix_dtask_schedules_next_due_at",
        "dtask_schedules",
        ["next_due_at"],
        postgresql_where=sa.text("enabled"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_schedules_next_due_at", "dtask_schedules")
    op.drop_column("dtask_schedules", "next_due_at")
