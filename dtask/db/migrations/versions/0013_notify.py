"""completion notification: a run's notify_url and its delivery; each client's signing secret

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("notify_url", sa.Text(), nullable=True))
    op.add_column("dtask_runs", sa.Column("notify_state", sa.String(12), nullable=True))
    op.add_column(
        "dtask_runs",
        sa.Column("notify_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "dtask_runs", sa.Column("notify_next_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("dtask_runs", sa.Column("notify_error", sa.Text(), nullable=True))
    op.add_column("dtask_runs", sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        "ck_dtask_runs_notify_state",
        "dtask_runs",
        "notify_state IN ('waiting', 'delivered', 'failed')",
    )
    op.create_index(
        "ix_dtask_runs_notify_next_at",
        "dtask_runs",
        ["notify_next_at"],
        postgresql_where=sa.text("notify_state = 'waiting'"),
    )
    op.create_table(
        "dtask_webhook_secrets",
        sa.Column("client", sa.String(100), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("client", name="pk_dtask_webhook_secrets"),
    )


def downgrade() -> None:
    op.drop_table("dtask_webhook_secrets")
    op.drop_index("ix_dtask_runs_notify_next_at", table_name="dtask_runs")
    op.drop_constraint("ck_dtask_runs_notify_state", "dtask_runs", type_="check")
    for column in (
        "notified_at", "notify_error", "notify_next_at", "notify_attempts", "notify_state",
        "notify_url",
    ):  # fmt: skip
        op.drop_column("dtask_runs", column)
