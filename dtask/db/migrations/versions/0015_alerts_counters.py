"""alerts (open until their condition clears), cluster-wide counters for /metrics, each
worker's busy slots and idle time, each schedule's latest misfire

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dtask_alerts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column(
            "opened_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True)),
    )
    op.create_index(
        "ux_dtask_alerts_open",
        "dtask_alerts",
        ["kind", "subject"],
        unique=True,
        postgresql_where=sa.text("closed_at IS NULL"),
    )
    op.create_table(
        "dtask_counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("label", sa.String(200), primary_key=True, server_default=""),
        sa.Column("value", sa.Float, nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "dtask_workers", sa.Column("busy", sa.Integer, nullable=False, server_default=sa.text("0"))
    )
    op.add_column(
        "dtask_workers",
        sa.Column("idle_since", sa.DateTime(timezone=True), server_default=sa.func.now()),
    )
    op.add_column("dtask_schedules", sa.Column("misfired_at", sa.DateTime(timezone=True)))
    op.add_column("dtask_schedules", sa.Column("misfire_note", sa.Text))


def downgrade() -> None:
    op.drop_column("dtask_schedules", "misfire_note")
    op.drop_column("dtask_schedules", "misfired_at")
    op.drop_column("dtask_workers", "idle_since")
    op.drop_column("dtask_workers", "busy")
    op.drop_table("dtask_counters")
    op.drop_index("ux_dtask_alerts_open", table_name="dtask_alerts")
    op.drop_table("dtask_alerts")
