"""a worker claims a window message as one row (issue 59, the claim half)

`dtask_messages` gains a claim: `fence` (0 until first taken), `owner` and `lease_expires_at`.
A worker that takes a dispatcher's message takes its row, not its children's: they stay
pending and unwritten, covered by the message, until each one's end is written under the
message's fence. `children` now counts the children the message still covers. Owned messages
are found by their own index (the reaper's expired ones, readers' running counts).

Revision ID: 0039
Revises: 0038
"""

import sqlalchemy as sa
from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_messages",
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("dtask_messages", sa.Column("owner", sa.String(length=200), nullable=True))
    op.add_column(
        "dtask_messages",
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        op.f("ix_dtask_messages_run_id_lease_expires_at"),
        "dtask_messages",
        ["run_id", "lease_expires_at"],
        postgresql_where=sa.text("owner IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_dtask_messages_run_id_lease_expires_at"), table_name="dtask_messages")
    op.drop_column("dtask_messages", "lease_expires_at")
    op.drop_column("dtask_messages", "owner")
    op.drop_column("dtask_messages", "fence")
