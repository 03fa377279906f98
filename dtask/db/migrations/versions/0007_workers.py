"""workers: each live `dtask worker` reports its queues and slots

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dtask_workers",
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.String(200)), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "seen_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("name", name="pk_dtask_workers"),
    )


def downgrade() -> None:
    op.drop_table("dtask_workers")
