"""a run may start later: apply_async(countdown=, eta=)

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("start_after", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("dtask_runs", "start_after")
