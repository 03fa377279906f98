"""dispatch window: children may wait unsent in PostgreSQL (sent_at NULL); runs count them

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("dtask_children", "sent_at", nullable=True)
    op.add_column(
        "dtask_runs", sa.Column("unsent", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.create_index(
        "ix_dtask_children_run_id_index",
        "dtask_children",
        ["run_id", "index"],
        postgresql_where=sa.text("state = 'pending' AND sent_at IS NULL"),
    )
    op.create_index(
        "ix_dtask_runs_unsent", "dtask_runs", ["unsent"], postgresql_where=sa.text("unsent > 0")
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_unsent", table_name="dtask_runs")
    op.drop_index("ix_dtask_children_run_id_index", table_name="dtask_children")
    op.drop_column("dtask_runs", "unsent")
    op.execute("UPDATE dtask_children SET sent_at = now() WHERE sent_at IS NULL")
    op.alter_column("dtask_children", "sent_at", nullable=False)
