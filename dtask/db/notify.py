"""Completion notifications: which finished runs are due a delivery, the outcome of each try,
and each client's signing secret. Any number of workers deliver: a due run is taken for a
while (``hold``) with SKIP LOCKED, so two never post the same try."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from dtask.db.database import Database, sql
from dtask.domain.notify import RETRY_FOR, Delivery


@dataclass(frozen=True)
class Due:
    run_id: int
    client: str
    url: str
    attempts: int
    give_up: bool  # this is the last try: the run finished over RETRY_FOR ago


class NotifyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def secret(self, client: str) -> str:
        """The client's signing secret, made on first use."""
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "INSERT INTO dtask_webhook_secrets (client, secret) VALUES (:c, :s)"
                    " ON CONFLICT (client) DO NOTHING"
                ),
                {"c": client, "s": secrets.token_urlsafe(32)},
            )
            found: str = conn.execute(
                sql("SELECT secret FROM dtask_webhook_secrets WHERE client = :c"), {"c": client}
            ).scalar_one()
        return found

    def rotate(self, client: str) -> str:
        with self.db.tx() as conn:
            conn.execute(sql("DELETE FROM dtask_webhook_secrets WHERE client = :c"), {"c": client})
        return self.secret(client)

    def due(self, limit: int, hold: float) -> list[Due]:
        """Finished runs whose notification is due now, taken for ``hold`` seconds."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_next_at = now() + make_interval(secs => :hold)"
                    " WHERE id IN (SELECT id FROM dtask_runs WHERE notify_state = 'waiting'"
                    "   AND state IN ('succeeded', 'failed', 'cancelled')"
                    "   AND coalesce(notify_next_at, '-infinity') <= now()"
                    "   ORDER BY notify_next_at NULLS FIRST LIMIT :limit FOR UPDATE SKIP LOCKED)"
                    " RETURNING id, client, notify_url, notify_attempts,"
                    "   finished_at < now() - make_interval(secs => :retry_for) AS give_up"
                ),
                {"hold": hold, "limit": limit, "retry_for": RETRY_FOR},
            ).all()
        return [Due(r.id, r.client, r.notify_url, r.notify_attempts, r.give_up) for r in rows]

    def delivered(self, run_id: int) -> None:
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_state = :state,"
                    " notify_attempts = notify_attempts + 1, notified_at = now(),"
                    " notify_error = NULL, notify_next_at = NULL WHERE id = :id"
                ),
                {"id": run_id, "state": Delivery.DELIVERED.value},
            )

    def failed(self, due: Due, error: str, retry_in: float) -> None:
        """A try failed: again in ``retry_in`` seconds, or never when it was the last."""
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_attempts = notify_attempts + 1,"
                    " notify_error = :error, notify_state = :state,"
                    " notify_next_at = now() + make_interval(secs => :retry_in) WHERE id = :id"
                ),
                {
                    "id": due.run_id,
                    "error": error[:1000],
                    "retry_in": retry_in,
                    "state": (Delivery.FAILED if due.give_up else Delivery.WAITING).value,
                },
            )
