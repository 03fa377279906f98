"""a cancel that terminates: the run's running children are stopped within seconds

`dtask cancel RUN --terminate` sets it with the cancel; a child's heartbeat that sees its run
cancelled reads it, and a child that does not stop at its next step within
DTASK_EXECUTION_CAP_GRACE has its pool process killed (released first: a rerun resumes it).

Revision ID: 0033
Revises: 0032
"""

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_runs",
        sa.Column("terminate", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )


def downgrade() -> None:
    op.drop_column("dtask_runs", "terminate")
