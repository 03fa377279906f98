"""Alembic environment: the connection dtask hands over, or dtask's configured database.

dtask's history lives in its own version table, so an application's Alembic history can share
the database."""

from alembic import context
from sqlalchemy import Connection, text

from dtask.db.models import Base
from dtask.db.schema import MIGRATION_LOCK, VERSION_TABLE, only_dtask_tables

target_metadata = Base.metadata


def run(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=only_dtask_tables,
    )
    context.run_migrations()


def main() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        from dtask.services import database_url

        url = database_url()
    from sqlalchemy import create_engine

    engine = create_engine(url)
    with engine.begin() as conn:
        run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("dtask migrations run online only")
main()
