"""Every connection has bounded waits (issue 15, hole 7): PostgreSQL's statement, lock and
idle-in-transaction limits, TCP keepalive / user timeout against links that drop packets, and
(issue 58, item 11) a bound on dtask's own clock against links that take every byte and never
answer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dtask import services
from dtask.db import Database, Limits, engine_for
from dtask.db.database import RUN_LOCKS, lock_run
from dtask.exceptions import DatabaseUnavailable
from tests.support.blackhole import BlackholeRelay

LIMITS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def test_the_store_s_sessions_have_the_default_limits(dtask_env: dict[str, str]) -> None:
    db = services.store().db
    for connect in (db.tx, db.owner):
        with connect() as conn:
            shown = {name: conn.execute(text(f"SHOW {name}")).scalar() for name in LIMITS}
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert shown == {
            "statement_timeout": "1min",
            "lock_timeout": "30s",
            "idle_in_transaction_session_timeout": "1min",
        }
        assert params["keepalives"] == "1" and params["tcp_user_timeout"] == "8000"
        assert params["connect_timeout"] == "8"


def test_a_lock_nobody_releases_fails_the_waiter_within_the_lock_timeout(
    dtask_env: dict[str, str],
) -> None:
    url = services.database_url()
    holder = services.store().engine.connect()
    holder.execute(text("SELECT pg_advisory_lock(:ns, 424242)"), {"ns": RUN_LOCKS})
    try:
        db = Database(engine_for(url, limits=Limits(lock_timeout=0.5)))
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=r"lock timeout.*55P03"), db.tx() as conn:
            lock_run(conn, 424242)
        assert time.monotonic() - started < 5
    finally:
        holder.execute(text("SELECT pg_advisory_unlock(:ns, 424242)"), {"ns": RUN_LOCKS})
        holder.close()


def test_a_statement_past_its_limit_is_cancelled(dtask_env: dict[str, str]) -> None:
    db = Database(engine_for(services.database_url(), limits=Limits(statement_timeout=0.5)))
    with pytest.raises(DatabaseUnavailable, match=r"statement timeout.*57014"), db.tx() as conn:
        conn.execute(text("SELECT pg_sleep(5)"))


@pytest.fixture
def through_relay(dtask_env: dict[str, str]) -> Iterator[tuple[BlackholeRelay, Database]]:
    """A store's Database reaching PostgreSQL through a relay that can blackhole the link,
    with a network timeout of 2 s."""
    url = make_url(services.database_url())
    relay = BlackholeRelay(f"{url.query['host']}/.s.PGSQL.{url.port or 5432}")
    through = f"postgresql+psycopg://{url.username}@127.0.0.1:{relay.port}/{url.database}"
    limits = Limits(network_timeout=2)
    engine = engine_for(through, limits=limits)
    try:
        yield relay, Database(engine, limits)
    finally:
        relay.heal()
        engine.dispose()
        relay.close()


@pytest.mark.timeout(60)  # it waited for ever before the watchdog
def test_a_statement_on_a_blackholed_link_fails_in_seconds_not_never(
    through_relay: tuple[BlackholeRelay, Database],
) -> None:
    """The relay's kernel acknowledges every byte, so no TCP timer fires: dtask's watchdog
    ends the wait (no answer for half the network timeout, nor to a new connection)."""
    relay, db = through_relay
    no_answer = r"cannot reach PostgreSQL.*no answer for"
    with pytest.raises(DatabaseUnavailable, match=no_answer), db.owner() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
        relay.cut()
        started = time.monotonic()
        conn.execute(text("SELECT 1"))
    waited = time.monotonic() - started
    print(f"\nblackholed statement failed after {waited:.2f} s (network timeout 2 s)")
    assert waited < 15
    relay.heal()
    with db.owner() as conn:  # a connection opened anew where the dropped one was
        assert conn.execute(text("SELECT 2")).scalar() == 2


def test_a_slow_statement_on_a_link_that_answers_is_left_alone(
    through_relay: tuple[BlackholeRelay, Database],
) -> None:
    """Its wait outlasts the network timeout twice, but a new connection gets an answer each
    time the watchdog tries: only the server's statement_timeout bounds it."""
    _, db = through_relay
    started = time.monotonic()
    with db.owner() as conn:
        assert conn.execute(text("SELECT 7 FROM pg_sleep(4.5)")).scalar() == 7
    assert time.monotonic() - started >= 4.5
