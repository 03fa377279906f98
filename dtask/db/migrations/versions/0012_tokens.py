"""API tokens: per client, stored as a SHA-256 of the secret

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dtask_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("client", sa.String(100), nullable=False),
        sa.Column("admin", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("hint", sa.String(16), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dtask_tokens"),
        sa.UniqueConstraint("digest", name="uq_dtask_tokens_digest"),
    )


def downgrade() -> None:
    op.drop_table("dtask_tokens")
