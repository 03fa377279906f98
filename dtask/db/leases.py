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

    def release(self, name: str, holder: str) -> None:
        with self.db.tx() as conn:
            conn.execute(
                sql("DELETE FROM dtask_leases WHERE name = :name AND holder = :holder"),
                {"name": name, "holder": holder},
            )
