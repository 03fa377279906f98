"""clients: dtask_clients (limits), and each run's client, priority and charged children

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

PERIODS = "'s', 'm', 'h', 'd'"


def upgrade() -> None:
    op.create_table(
        "dtask_clients",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("rate_count", sa.Integer(), nullable=True),
        sa.Column("rate_period", sa.String(1), nullable=True),
        sa.Column("child_rate_count", sa.Integer(), nullable=True),
        sa.Column("child_rate_period", sa.String(1), nullable=True),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Float(), server_default=sa.text("1"), nullable=False),
        sa.Column("tier", sa.String(16), nullable=True),
        sa.Column("max_priority", sa.SmallInteger(), server_default=sa.text("9"), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(f"rate_period IN ({PERIODS})", name="ck_dtask_clients_rate_period"),
        sa.CheckConstraint(
            f"child_rate_period IN ({PERIODS})", name="ck_dtask_clients_child_rate_period"
        ),
        sa.CheckConstraint(
            "(rate_count IS NULL) = (rate_period IS NULL)", name="ck_dtask_clients_rate"
        ),
        sa.CheckConstraint(
            "(child_rate_count IS NULL) = (child_rate_period IS NULL)",
            name="ck_dtask_clients_child_rate",
        ),
        sa.CheckConstraint("tier IN ('basic', 'regular', 'premium')", name="ck_dtask_clients_tier"),
        sa.CheckConstraint("max_priority BETWEEN 0 AND 9", name="ck_dtask_clients_max_priority"),
        sa.PrimaryKeyConstraint("name", name="pk_dtask_clients"),
    )
    op.add_column(
        "dtask_runs",
        sa.Column("client", sa.String(100), server_default="default", nullable=False),
    )
    op.add_column(
        "dtask_runs",
        sa.Column("priority", sa.SmallInteger(), server_default=sa.text("5"), nullable=False),
    )
    op.add_column("dtask_runs", sa.Column("expected_children", sa.Integer(), nullable=True))
    op.create_check_constraint("ck_dtask_runs_priority", "dtask_runs", "priority BETWEEN 0 AND 9")
    op.create_index("ix_dtask_runs_client_created_at", "dtask_runs", ["client", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_client_created_at", table_name="dtask_runs")
    op.drop_constraint("ck_dtask_runs_priority", "dtask_runs", type_="check")
    op.drop_column("dtask_runs", "expected_children")
    op.drop_column("dtask_runs", "priority")
    op.drop_column("dtask_runs", "client")
    op.drop_table("dtask_clients")
