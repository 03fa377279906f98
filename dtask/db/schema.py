"""Schema migrations (Alembic), applied automatically when the database is behind."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from dtask.db.engine import unreachable

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
HEAD = "0015"
_upgrading = threading.Lock()


def alembic_config(url: str) -> object:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def current_revision(engine: Engine) -> str | None:
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except ProgrammingError:
        return None
    except OperationalError as exc:
        raise unreachable(exc, engine) from None


def upgrade(engine: Engine) -> None:
    """``alembic upgrade head`` on this engine's database (concurrent callers serialize)."""
    from alembic import command

    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with _upgrading, engine.begin() as conn:  # alembic's context is process-global
        # A migration may rewrite a big table, or wait for another process's migration: the
        # runtime statement and lock limits do not apply (the network limit still does).
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        conn.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
        config.attributes["connection"] = conn  # type: ignore[attr-defined]
        command.upgrade(config, "head")  # type: ignore[arg-type]


def ensure(engine: Engine) -> None:
    if current_revision(engine) != HEAD:
        upgrade(engine)
