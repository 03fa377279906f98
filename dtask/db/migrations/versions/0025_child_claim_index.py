"""plans that cannot read a large run whole

A claim finds its message's children by (run, state, index) whatever the statistics say:
without statistics (a fresh table, or a large run split since autovacuum's last ANALYZE) the
planner answered "these indexes of the run, pending or expired" through the (run_id, state)
index, every pending child of the run read for each message (27 ms a claim at 100,000).

The running children's lease index holds only rows with a lease: its predicate was only
"state = 'running'", which every write to one child by its id also says, and where the
statistics counted no running child (taken at a split) the planner read the whole partial
index, dead entries too, for each child's start, heartbeat and finish instead of its key.

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
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
    _lease_index(LEASED)


def downgrade() -> None:
    op.create_index("ix_dtask_children_run_id_state", "dtask_children", ["run_id", "state"])
    op.drop_index("ix_dtask_children_run_id_state_index", table_name="dtask_children")
    _lease_index("state = 'running'")


LEASED = "state = 'running' AND lease_expires_at IS NOT NULL"


def _lease_index(where: str) -> None:
    op.drop_index("ix_dtask_children_lease_expires_at", table_name="dtask_children")
    op.create_index(
        "ix_dtask_children_lease_expires_at",
        "dtask_children",
        ["lease_expires_at"],
        postgresql_where=sa.text(where),
    )
