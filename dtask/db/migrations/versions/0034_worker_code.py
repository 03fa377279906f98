"""what code a worker runs: its templates' module files and their times, as it loaded them

`dtask status` reads it to say "workers run an older version of myjobs.py" when a run waits
for a template its workers do not know and those files changed since.

Revision ID: 0034
Revises: 0033
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_workers", sa.Column("code", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_workers", "code")
