"""workers: the templates each knows (the dispatcher sends no child to a queue where no live
worker can run it)

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "dtask_workers",
        sa.Column("templates", postgresql.ARRAY(sa.String(200)), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("dtask_workers", "templates")
