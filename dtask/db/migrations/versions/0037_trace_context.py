"""a run's trace context: the W3C headers of its submit's span (docs/traces.md)

`dtask_runs.trace_context`: `{"traceparent": ..., "tracestate": ...}` as OpenTelemetry's
propagator wrote them where the submit was traced; NULL otherwise (then no worker traces it).

Revision ID: 0037
Revises: 0036
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0037"
down_revision = "0036"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dtask_runs", sa.Column("trace_context", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("dtask_runs", "trace_context")
