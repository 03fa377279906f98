"""the broker's losses the reaper found, per queue: what the messages_lost alert reads

When the reaper finds a queue's broker holding fewer messages than PostgreSQL has sent
(restarted without its data, flushed, the queue deleted, a failover that lost its last
writes) and re-sends the overdue children, it notes how many were missing and when; the
monitor opens `messages_lost` for the queue and closes it once no loss was found for
DTASK_LOST_MESSAGES_ALERT seconds.

Revision ID: 0031
Revises: 0030
"""

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dtask_lost_messages",
        sa.Column("queue", sa.String(200), primary_key=True),
        sa.Column("missing", sa.Integer(), nullable=False),
        sa.Column("resent", sa.Integer(), nullable=False),
        sa.Column("found_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dtask_lost_messages")
