"""a run split by live capacity keeps the slots its split saw

`RangeSplit(parts="slots")` decides the number of children when the master splits, from the
live worker slots of the run's queue and tier; `dtask status` shows what it saw. NULL for every
other run.

Revision ID: 0029
Revises: 0028
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("split_slots", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_runs", "split_slots")
