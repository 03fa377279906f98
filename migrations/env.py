"""Alembic environment: the connection dtask hands over, or dtask's configured database."""

from alembic import context
from sqlalchemy import text

from dtask.db.models import Base

target_metadata = Base.metadata
MIGRATION_LOCK = 0x64746B4D  # serializes concurrent `upgrade head` calls from many processes


def run(connection):
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    context.configure(connection=connection, target_metadata=target_metadata)
    context.run_migrations()


def main():
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
