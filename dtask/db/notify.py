"""Completion notifications: which finished runs are due a delivery, the outcome of each try,
and each client's signing secret. Any number of workers deliver: a due run is taken for a
while (``hold``) with SKIP LOCKED, so two never post the same try, and a try's outcome is
written only by the holder whose hold it still is."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from dtask.db.database import Database, sql
from dtask.domain.notify import RETRY_FOR, Delivery


@dataclass(frozen=True)
class Due:
    run_id: int
    client: str
    url: str
    attempts: int
    give_up: bool  # this is the last try: the run finished over RETRY_FOR ago
    held: datetime  # the end of this hold (notify_next_at as due() set it): its fence


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
        """Finished runs whose notification is due now, taken for ``hold`` seconds (longer
        than a try takes, or another worker takes the run again while it is tried)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_next_at = now() + make_interval(secs => :hold)"
                    " WHERE id IN (SELECT id FROM dtask_runs WHERE notify_state = 'waiting'"
                    "   AND state IN ('succeeded', 'failed', 'cancelled')"
                    "   AND coalesce(notify_next_at, '-infinity') <= now()"
                    "   ORDER BY notify_next_at NULLS FIRST LIMIT :limit FOR UPDATE SKIP LOCKED)"
                    " RETURNING id, client, notify_url, notify_attempts,"
                    "   finished_at < now() - make_interval(secs => :retry_for) AS give_up,"
                    "   notify_next_at AS held"
                ),
                {"hold": hold, "limit": limit, "retry_for": RETRY_FOR},
            ).all()
        return [
            Due(r.id, r.client, r.notify_url, r.notify_attempts, r.give_up, r.held) for r in rows
        ]

    # The outcome of a try is written only while the hold that ``due()`` gave is the run's:
    # a worker can outlive its hold (frozen, cut off from PostgreSQL, a pass slower than the
    # hold), and by then another worker may have taken the run, tried it and written its own
    # outcome, or hold it now. Written by id alone, the late outcome would overwrite that one:
    # "delivered" over a newer failure (or the reverse), an attempt counted twice, a give-up
    # undone, or the new holder's hold ended under it. A hold is told apart by the
    # ``notify_next_at`` it set (``now()`` of its own transaction, to the microsecond).
    _HELD = " WHERE id = :id AND notify_state = 'waiting' AND notify_next_at = :held"

    def delivered(self, due: Due) -> bool:
        """The try was answered 2xx; False (nothing written) when the hold was no longer
        ``due``'s."""
        with self.db.tx() as conn:
            written = conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_state = :state,"
                    " notify_attempts = notify_attempts + 1, notified_at = now(),"
                    " notify_error = NULL, notify_next_at = NULL" + self._HELD
                ),
                {"id": due.run_id, "held": due.held, "state": Delivery.DELIVERED.value},
            ).rowcount
        return bool(written)

    def failed(self, due: Due, error: str, retry_in: float) -> bool:
        """A try failed: again in ``retry_in`` seconds, or never when it was the last. False
        (nothing written) when the hold was no longer ``due``'s."""
        with self.db.tx() as conn:
            written = conn.execute(
                sql(
                    "UPDATE dtask_runs SET notify_attempts = notify_attempts + 1,"
                    " notify_error = :error, notify_state = :state,"
                    " notify_next_at = now() + make_interval(secs => :retry_in)" + self._HELD
                ),
                {
                    "id": due.run_id,
                    "held": due.held,
                    "error": error[:1000],
                    "retry_in": retry_in,
                    "state": (Delivery.FAILED if due.give_up else Delivery.WAITING).value,
                },
            ).rowcount
        return bool(written)
