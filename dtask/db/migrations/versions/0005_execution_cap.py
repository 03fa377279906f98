"""a run's execution cap (seconds an attempt of its children may run; NULL: the template's)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("execution_cap", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_runs", "execution_cap")
