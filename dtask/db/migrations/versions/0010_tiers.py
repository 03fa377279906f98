"""resource tiers: the tier a run's children need (its queue already names it)

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_runs", sa.Column("tier", sa.String(16), server_default="basic", nullable=False)
    )
    op.create_check_constraint(
        "ck_dtask_runs_tier", "dtask_runs", "tier IN ('basic', 'regular', 'premium')"
    )


def downgrade() -> None:
    op.drop_constraint("ck_dtask_runs_tier", "dtask_runs", type_="check")
    op.drop_column("dtask_runs", "tier")
