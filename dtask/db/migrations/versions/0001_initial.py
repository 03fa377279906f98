"""runs and children

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

RUN_STATES = "state IN ('pending', 'splitting', 'running', 'succeeded', 'failed', 'cancelled')"
CHILD_STATES = "state IN ('pending', 'running', 'succeeded', 'failed')"


def upgrade() -> None:
    op.create_table(
        "dtask_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("template", sa.String(100), nullable=False),
        sa.Column("trigger_key", sa.String(300), nullable=False),
        sa.Column("variables", postgresql.JSONB(), nullable=False),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(200), nullable=True),
        sa.Column("child_total", sa.Integer(), nullable=True),
        sa.Column("group_id", sa.String(100), nullable=True),
        sa.Column("dispatches", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(RUN_STATES, name=op.f("ck_dtask_runs_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dtask_runs")),
        sa.UniqueConstraint("trigger_key", name=op.f("uq_dtask_runs_trigger_key")),
    )
    op.create_index(
        op.f("ix_dtask_runs_state"),
        "dtask_runs",
        ["state"],
        postgresql_where=sa.text("state IN ('pending', 'splitting', 'running')"),
    )
    op.create_table(
        "dtask_children",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("spec", postgresql.JSONB(), nullable=False),
        sa.Column("state", sa.String(16), server_default="pending", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("checkpoint", postgresql.JSONB(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(CHILD_STATES, name=op.f("ck_dtask_children_state")),
        sa.CheckConstraint(
            "attempt >= 0 AND attempt <= max_attempts", name=op.f("ck_dtask_children_attempt")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["dtask_runs.id"],
            name=op.f("fk_dtask_children_run_id_dtask_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dtask_children")),
        sa.UniqueConstraint("run_id", "index", name=op.f("uq_dtask_children_run_id_index")),
    )
    op.create_index(op.f("ix_dtask_children_run_id_state"), "dtask_children", ["run_id", "state"])
    op.create_index(
        op.f("ix_dtask_children_lease_expires_at"),
        "dtask_children",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'running'"),
    )


def downgrade() -> None:
    op.drop_table("dtask_children")
    op.drop_table("dtask_runs")
