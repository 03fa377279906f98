"""Schema migrations (Alembic), shipped inside the package (``dtask/db/migrations``).

dtask keeps its own version table, ``dtask_alembic_version``, so it shares a database with an
application's own Alembic history. A database dtask migrated before that (when it used Alembic's
default ``alembic_version``) is adopted on the next ``upgrade``.
"""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from dtask.db.engine import unreachable
from dtask.exceptions import SchemaMismatch
from dtask.settings import shown_url

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
HEAD = "0039"
VERSION_TABLE = "dtask_alembic_version"
LEGACY_VERSION_TABLE = "alembic_version"
MIGRATION_LOCK = 0x64746B4D  # serializes concurrent `upgrade head` calls from many processes
_upgrading = threading.Lock()


def only_dtask_tables(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's ``include_name``: dtask's tables only, never an application's beside them."""
    return type_ != "table" or (name or "").startswith("dtask_")


def known_revisions() -> list[str]:
    """dtask's revision ids, oldest first (each file's name starts with its id)."""
    return sorted(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*.py"))


def alembic_config(url: str) -> object:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def current_revision(engine: Engine) -> str | None:
    """dtask's revision of this database (None: no dtask schema), the legacy table included."""
    try:
        with engine.connect() as conn:
            return _revision(conn) or _legacy_revision(conn)
    except OperationalError as exc:
        raise unreachable(exc, engine) from None


def _revision(conn: Connection) -> str | None:
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": VERSION_TABLE}).scalar() is None:
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def _legacy_revision(conn: Connection) -> str | None:
    """A revision of dtask's in Alembic's default table, where dtask's tables exist beside it
    (an application's own history there, with ids that happen to look like dtask's, does not
    count without them)."""
    tables = conn.execute(
        text("SELECT to_regclass(:legacy) IS NOT NULL AND to_regclass('dtask_runs') IS NOT NULL"),
        {"legacy": LEGACY_VERSION_TABLE},
    ).scalar()
    if not tables:
        return None
    return conn.execute(
        text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE} WHERE version_num = ANY(:known)"),
        {"known": known_revisions()},
    ).scalar()


def _adopt_legacy(conn: Connection) -> None:
    """Move dtask's row out of ``alembic_version`` into its own table (dropping the old table
    when nothing else was in it)."""
    if _revision(conn) is not None:
        return
    legacy = _legacy_revision(conn)
    if legacy is None:
        return
    conn.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL,"
            f" CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
        )
    )
    conn.execute(text(f"INSERT INTO {VERSION_TABLE} VALUES (:v)"), {"v": legacy})
    conn.execute(text(f"DELETE FROM {LEGACY_VERSION_TABLE} WHERE version_num = :v"), {"v": legacy})
    if conn.execute(text(f"SELECT count(*) FROM {LEGACY_VERSION_TABLE}")).scalar() == 0:
        conn.execute(text(f"DROP TABLE {LEGACY_VERSION_TABLE}"))


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
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        _adopt_legacy(conn)
        config.attributes["connection"] = conn  # type: ignore[attr-defined]
        command.upgrade(config, "head")  # type: ignore[arg-type]


def refuse_newer(engine: Engine, revision: str | None) -> None:
    """A schema written by a newer dtask: one line, before Alembic's own error."""
    if revision is not None and revision not in known_revisions():
        where = shown_url(engine.url)
        raise SchemaMismatch(
            f"PostgreSQL at {where} has dtask schema {revision}, newer than this dtask knows"
            f" (up to {HEAD}): upgrade dtask on this machine"
        )


def ensure(engine: Engine, migrate: bool) -> None:
    """The schema at HEAD: migrated if ``migrate``, else a one-line refusal that says what to
    run (a shared database is migrated on purpose, by ``dtask migrate``)."""
    revision = current_revision(engine)
    if revision == HEAD:
        return
    refuse_newer(engine, revision)
    if migrate:
        upgrade(engine)
        return
    where = shown_url(engine.url)
    if revision is None:
        have = "has no dtask schema"
    else:
        have = f"has dtask schema {revision}, this dtask needs {HEAD}"
    raise SchemaMismatch(
        f"PostgreSQL at {where} {have}: run `dtask migrate` (or set DTASK_AUTO_MIGRATE=1 to"
        " migrate when a process starts)"
    )
