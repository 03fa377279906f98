"""a window message's children are sent once, as one row (issue 59)

`dtask_messages`: one row per broker message of several children of a run that the
dispatcher sent (`DTASK_DISPATCH=window`): the run, its first and last child's index, how many
children it carries, when it was sent and when a worker first took it. `dtask_runs.
sent_through`: the dispatcher has taken the run's children below this index. A child in such
a message is no longer written when it is sent (its `sent_at` stays NULL): it is pending,
unsent-looking and below its run's mark, covered by its message's row. Deleted with its run.

Revision ID: 0038
Revises: 0037
"""

import sqlalchemy as sa
from alembic import op

revision = "0038"
down_revision = "0037"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_runs",
        sa.Column("sent_through", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "dtask_messages",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("lo", sa.Integer(), nullable=False),
        sa.Column("hi", sa.Integer(), nullable=False),
        sa.Column("children", sa.Integer(), nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["dtask_runs.id"],
            name=op.f("fk_dtask_messages_run_id_dtask_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dtask_messages")),
        sa.UniqueConstraint("run_id", "lo", name=op.f("uq_dtask_messages_run_id_lo")),
    )
    op.create_index(
        op.f("ix_dtask_messages_sent_at"),
        "dtask_messages",
        ["sent_at"],
        postgresql_where=sa.text("claimed_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_dtask_messages_sent_at"), table_name="dtask_messages")
    op.drop_table("dtask_messages")
    op.drop_column("dtask_runs", "sent_through")
