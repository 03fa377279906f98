"""a run keeps the rest of the Celery chains its submit task took over

`template.s()` is the task `dtask.submit`; in a chain the next step ran at once with the run's
id. The submit task now takes the rest of its chain (and its link / link_error callbacks) over
and stores it with the run, as a JSON list (one entry per submit that returned this run: a
trigger key's second submit adds its own); the run's finalize sends it with the run's result,
or fails it with the run's error, and sets the column back to NULL. A partial index lists the
finished runs whose chains are still to go (the reaper's step).

Revision ID: 0028
Revises: 0027
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("chains", postgresql.JSONB(), nullable=True))
    op.create_index(
        "ix_dtask_runs_id_chained",
        "dtask_runs",
        ["id"],
        postgresql_where=sa.text("chains IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_dtask_runs_id_chained", table_name="dtask_runs")
    op.drop_column("dtask_runs", "chains")
