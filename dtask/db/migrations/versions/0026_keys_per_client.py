"""trigger keys belong to clients: UNIQUE (client, trigger_key)

A trigger key was unique across every client, so a client learned from its own submits whether
another client's key existed (its run's id, and whether its template and variables differed),
and could take another client's next key first: that client's own submit then answered with
a run it may not see, and its run never existed. A key is now unique per client: two clients
may use the same key and get two runs, one client gets one run per key as before. Every lookup
by key names its client too, so the new constraint's index, (client, trigger_key), serves them.

The existing keys are unique across clients, hence per client: every run is kept as it is. A
downgrade refuses (in one line, changing nothing) while two clients share a key.

Revision ID: 0026
Revises: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_unique_constraint(
        op.f("uq_dtask_runs_client_trigger_key"), "dtask_runs", ["client", "trigger_key"]
    )
    op.drop_constraint(op.f("uq_dtask_runs_trigger_key"), "dtask_runs", type_="unique")


def downgrade() -> None:
    shared = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT trigger_key, count(*) AS clients, count(*) OVER () AS keys"
                " FROM dtask_runs GROUP BY trigger_key HAVING count(*) > 1"
                " ORDER BY trigger_key LIMIT 1"
            )
        )
        .first()
    )
    if shared is not None:
        raise RuntimeError(
            f"cannot downgrade below 0026: trigger key {shared.trigger_key!r} is used by"
            f" {shared.clients} clients ({shared.keys} such key(s)), and 0025 allows a key"
            " once across all clients: delete those runs first"
        )
    op.create_unique_constraint(op.f("uq_dtask_runs_trigger_key"), "dtask_runs", ["trigger_key"])
    op.drop_constraint(op.f("uq_dtask_runs_client_trigger_key"), "dtask_runs", type_="unique")
