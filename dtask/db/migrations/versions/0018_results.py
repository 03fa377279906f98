"""a child's return value and its run's reduced result; a failed attempt's traceback and last output

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_children", sa.Column("result", postgresql.JSONB))
    op.add_column("dtask_children", sa.Column("traceback", sa.Text))
    op.add_column("dtask_children", sa.Column("output", sa.Text))
    op.add_column("dtask_runs", sa.Column("result", postgresql.JSONB))


def downgrade() -> None:
    op.drop_column("dtask_runs", "result")
    op.drop_column("dtask_children", "output")
    op.drop_column("dtask_children", "traceback")
    op.drop_column("dtask_children", "result")
