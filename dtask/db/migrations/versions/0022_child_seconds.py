"""runs: how long their children take, as their workers measure it (the dispatcher's batches)

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("child_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_runs", "child_seconds")
