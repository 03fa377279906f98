"""a running range child can be asked to give the second half of its rest away

Straggler stealing (docs/elastic.md): the dispatcher sets `give_away` on the running child
with the most work left when its queue has free slots and nothing waits; the child answers at
its next checkpoint by shrinking its own range and inserting the rest as a new child, in one
transaction under its fence. `cuts` counts the cuts that made a child's range what it is.

Revision ID: 0030
Revises: 0029
"""

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_children",
        sa.Column("give_away", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column(
        "dtask_children",
        sa.Column("cuts", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("dtask_children", "cuts")
    op.drop_column("dtask_children", "give_away")
