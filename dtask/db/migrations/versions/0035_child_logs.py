"""children you can see into: each attempt's last output and the worker that ran it

`dtask_children.worker`: the worker (host:pid) that ran the child's latest attempt, kept when
the attempt ends (its owner is cleared then). `dtask_child_logs`: one row per attempt that
failed or that printed while it ran (written by its heartbeat), with what it printed last
(at most DTASK_MAX_CHILD_LOG characters); a succeeded attempt's output stays in
`dtask_children.output`. Deleted with its run (retention).

Revision ID: 0035
Revises: 0034
"""

import sqlalchemy as sa
from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_children", sa.Column("worker", sa.String(200), nullable=True))
    op.create_table(
        "dtask_child_logs",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("skipped", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["dtask_runs.id"],
            name=op.f("fk_dtask_child_logs_run_id_dtask_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "index", "attempt", name=op.f("pk_dtask_child_logs")),
        sa.CheckConstraint(
            "state IN ('running', 'failed')", name=op.f("ck_dtask_child_logs_state")
        ),
    )


def downgrade() -> None:
    op.drop_table("dtask_child_logs")
    op.drop_column("dtask_children", "worker")
