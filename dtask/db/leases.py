"""Named leases: a role one process holds at a time, renewed while it lives, taken over once
it lapses (a dead or frozen holder loses it after ``seconds``)."""

from __future__ import annotations

from dtask.db.database import Database, sql


class LeaseStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def hold(self, name: str, holder: str, seconds: float) -> bool:
        """Take or renew ``name`` for ``holder`` for ``seconds``; False while another holds it."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "INSERT INTO dtask_leases (name, holder, expires_at)"
                    " VALUES (:name, :holder, now() + make_interval(secs => :seconds))"
                    " ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder,"
                    " expires_at = EXCLUDED.expires_at"
                    " WHERE dtask_leases.holder = EXCLUDED.holder"
                    " OR dtask_leases.expires_at < now()"
                    " RETURNING holder"
                ),
                {"name": name, "holder": holder, "seconds": seconds},
            ).first()
        return row is not None

    def due(self, name: str, seconds: float) -> bool:
        """Whether the cluster's next pass of ``name`` is this caller's, taking it: at most one
        every ``seconds`` in the whole cluster, whoever asks (one autocommit statement)."""
        with self.db.owner() as conn:
            row = conn.execute(
                sql(
                    "INSERT INTO dtask_leases (name, holder, expires_at)"
                    " VALUES (:name, '', now() + make_interval(secs => :seconds))"
                    " ON CONFLICT (name) DO UPDATE SET expires_at = EXCLUDED.expires_at"
                    " WHERE dtask_leases.expires_at <= now() RETURNING name"
                ),
                {"name": name, "seconds": seconds},
            ).first()
        return row is not None

    def next_due_in(self, name: str, seconds: float) -> None:
        """The cluster's next pass of ``name`` in ``seconds`` from now (a pass found nothing
        to do)."""
        with self.db.owner() as conn:
            conn.execute(
                sql(
                    "UPDATE dtask_leases SET expires_at = now() + make_interval(secs => :seconds)"
                    " WHERE name = :name"
                ),
                {"name": name, "seconds": seconds},
            )

    def release(self, name: str, holder: str) -> None:
        with self.db.tx() as conn:
            conn.execute(
                sql("DELETE FROM dtask_leases WHERE name = :name AND holder = :holder"),
                {"name": name, "holder": holder},
            )
