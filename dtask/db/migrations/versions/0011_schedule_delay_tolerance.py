"""a schedule's own delay tolerance and late policy (NULL: the template's)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_schedules", sa.Column("delay_tolerance", sa.Float(), nullable=True))
    op.add_column("dtask_schedules", sa.Column("on_late", sa.String(8), nullable=True))
    op.create_check_constraint(
        "ck_dtask_schedules_on_late", "dtask_schedules", "on_late IN ('run', 'fail')"
    )


def downgrade() -> None:
    op.drop_constraint("ck_dtask_schedules_on_late", "dtask_schedules", type_="check")
    op.drop_column("dtask_schedules", "on_late")
    op.drop_column("dtask_schedules", "delay_tolerance")
