"""dtask through a real PgBouncer in transaction mode (Debian's 1.18: no prepared statements
across server connections): it refuses dtask's startup options, or drops them when told to
ignore them; either way dtask finds out, prepares nothing and bounds each transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Database, Limits, engine_for
from dtask.db.pooler import ClientLimit, client_limit, pooled
from tests.support.pgbouncer import pgbouncer
from tests.support.ports import free_port


@pytest.mark.parametrize("ignore", ["", "extra_float_digits,options"], ids=["refused", "dropped"])
def test_dtask_finds_a_transaction_pooler_and_bounds_each_transaction(
    dtask_env: dict[str, str], ignore: str
) -> None:
    with pgbouncer(services.database_url(), server_connections=2, ignore=ignore) as url:
        limits = Limits(statement_timeout=7, lock_timeout=3, connections=6)
        engine = engine_for(url, limits=limits)
        db = Database(engine, limits)
        try:
            for _ in range(20):  # psycopg would prepare from the fifth on
                with db.tx() as conn:
                    assert pooled(conn.info)
                    shown = conn.execute(
                        text(
                            "SELECT current_setting('statement_timeout'),"
                            " current_setting('lock_timeout'), count(*) FROM dtask_runs"
                            " WHERE id = :id"
                        ),
                        {"id": 1},
                    ).one()
                    assert shown[:2] == ("7s", "3s")
                with db.owner() as conn:
                    conn.execute(
                        text("SELECT count(*) FROM dtask_workers WHERE slots = :s"), {"s": 1}
                    )
        finally:
            engine.dispose()


def test_a_direct_connection_is_not_taken_for_a_pooler(dtask_env: dict[str, str]) -> None:
    with services.store().db.tx() as conn:
        assert not pooled(conn.info)
        assert conn.execute(text("SHOW plan_cache_mode")).scalar() == "force_custom_plan"


def test_a_pooler_s_client_limit_is_read_from_its_console_or_says_why_not(
    dtask_env: dict[str, str],
) -> None:
    with pgbouncer(services.database_url(), clients=30, admin="postgres") as url:
        found = client_limit(url, 8)
        assert isinstance(found, ClientLimit) and found.most == 30 and found.in_use >= 1
    nobody = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres"
    why = client_limit(nobody, 2)
    assert isinstance(why, str) and "connection" in why and "\n" not in why
