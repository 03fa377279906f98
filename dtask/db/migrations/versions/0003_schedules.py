"""schedules, and the schedule slot that triggered a run

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("schedule", sa.String(100), nullable=True))
    op.add_column("dtask_runs", sa.Column("slot", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        op.f("ix_dtask_runs_schedule_id"),
        "dtask_runs",
        ["schedule", "id"],
        postgresql_where=sa.text("schedule IS NOT NULL"),
    )
    op.create_table(
        "dtask_schedules",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("template", sa.String(100), nullable=False),
        sa.Column("variables", postgresql.JSONB(), nullable=False),
        sa.Column("cron", sa.String(200), nullable=True),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("misfire", sa.String(16), nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("misfire_grace", sa.Float(), nullable=False),
        sa.Column("catch_up_window", sa.Float(), nullable=False),
        sa.Column("start_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("buffered_slot", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_id", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(cron IS NULL) <> (every_seconds IS NULL)", name=op.f("ck_dtask_schedules_trigger")
        ),
        sa.CheckConstraint(
            "misfire IN ('skip', 'run_once', 'catch_up')", name=op.f("ck_dtask_schedules_misfire")
        ),
        sa.CheckConstraint(
            "overlap IN ('allow', 'skip', 'buffer_one')", name=op.f("ck_dtask_schedules_overlap")
        ),
        sa.ForeignKeyConstraint(
            ["last_run_id"],
            ["dtask_runs.id"],
            name=op.f("fk_dtask_schedules_last_run_id_dtask_runs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dtask_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_dtask_schedules_name")),
    )


def downgrade() -> None:
    op.drop_table("dtask_schedules")
    op.drop_index(op.f("ix_dtask_runs_schedule_id"), table_name="dtask_runs")
    op.drop_column("dtask_runs", "slot")
    op.drop_column("dtask_runs", "schedule")
