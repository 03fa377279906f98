"""chord size per dispatch group (reruns dispatch a smaller chord)

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("chord_size", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_runs", "chord_size")
