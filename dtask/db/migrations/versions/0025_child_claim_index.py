"""a message's claim finds its children by (run, state, index) whatever the statistics say

Without statistics (a fresh table, or a large run split since autovacuum's last ANALYZE) the
planner answered a claim's "these indexes of the run, pending or expired" through the
(run_id, state) index: every pending child of the run read, for each message (27 ms a claim
at 100,000 children). With the index in the key it probes only the message's children.

Revision ID: 0025
Revises: 0024
"""

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_dtask_children_run_id_state_index", "dtask_children", ["run_id", "state", "index"]
    )
    op.drop_index("ix_dtask_children_run_id_state", table_name="dtask_children")


def downgrade() -> None:
    op.create_index("ix_dtask_children_run_id_state", "dtask_children", ["run_id", "state"])
    op.drop_index("ix_dtask_children_run_id_state_index", table_name="dtask_children")
