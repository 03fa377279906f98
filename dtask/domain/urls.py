"""The shapes of service URLs (DTASK_DATABASE_URL, DTASK_BROKER_URL, DTASK_RESULT_BACKEND),
each read as the library that will read it reads it (SQLAlchemy for PostgreSQL, urllib for
kombu and redis-py), so that what passes here none of them raises on later: a ValueError
saying what is wrong, never showing what a password spilled into. Pure."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import parse_qsl

POSTGRESQL = {"postgresql", "postgresql+psycopg"}


def failover(url: str | None) -> list[str]:
    """Each URL of kombu's failover list (``amqp://h1;amqp://h2``) or of a Sentinel URL."""
    return [] if url is None else re.split(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)", url)


def checked(url: str, example: str) -> str:
    """The URL's scheme, once its shape and port are sound (ValueError saying what is not):
    read as the library that will read it reads it, so that none of them raises later."""
    scheme, sep, rest = url.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise ValueError(f"must be a URL, e.g. {example}")
    lowered = scheme.lower()
    if lowered in POSTGRESQL or lowered.startswith("db+"):  # Celery's SQLAlchemy backend too
        host, port, spilled = _sqlalchemy_host(url[3:] if lowered.startswith("db+") else url)
    elif lowered.split("+")[0] in _URLLIB_READ:
        host, port, spilled = _urllib_host(rest)
    else:  # read by a library of its own: host[:port] after the last "@"
        hostport = rest.rsplit("@", 1)[-1].split("/", 1)[0].split("?", 1)[0]
        _, colon, port = (
            hostport.rpartition("]")[2] if hostport.startswith("[") else hostport
        ).rpartition(":")
        host, port, spilled = "", port if colon else "", False
    # where a password's "@", "/", "?" or "#" made part of it the host or port, it is not shown
    hint = "; percent-encode a password's @ : / ? # (%40 %3A %2F %3F %23)" if spilled else ""
    bad_v6 = host.startswith("[") and not _ipv6(host[1:-1] if host.endswith("]") else "")
    if bad_v6 or (not host.startswith("[") and ("[" in host or "]" in host)):
        raise ValueError(f"has a bad host: an IPv6 address goes in brackets, like [::1]:5432{hint}")
    if "@" in host:
        raise ValueError(f"has a bad host{hint}")
    if port and not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65_535):
        said = "" if spilled else f" {port[:20]!r}"
        raise ValueError(f"has a bad port{said} (1 to 65535{hint})")
    return lowered


# libpq's connection keywords (psycopg's libpq 18; tests/unit/test_bad_shapes.py compares them
# with the installed one's): SQLAlchemy hands every query parameter to psycopg, which raises
# on any other at each connect
LIBPQ_KEYWORDS = frozenset(
    {
        "application_name", "channel_binding", "client_encoding", "connect_timeout", "dbname",
        "fallback_application_name", "gssdelegation", "gssencmode", "gsslib", "host", "hostaddr",
        "keepalives", "keepalives_count", "keepalives_idle", "keepalives_interval", "krbsrvname",
        "load_balance_hosts", "max_protocol_version", "min_protocol_version", "oauth_client_id",
        "oauth_client_secret", "oauth_issuer", "oauth_scope", "options", "passfile", "password",
        "port", "replication", "require_auth", "requirepeer", "scram_client_key",
        "scram_server_key", "service", "ssl_max_protocol_version", "ssl_min_protocol_version",
        "sslcert", "sslcertmode", "sslcompression", "sslcrl", "sslcrldir", "sslkey",
        "sslkeylogfile", "sslmode", "sslnegotiation", "sslpassword", "sslrootcert", "sslsni",
        "target_session_attrs", "tcp_user_timeout", "user",
    }
)  # fmt: skip


def check_postgresql_query(url: str) -> None:
    """The query of a database URL, read as SQLAlchemy's psycopg dialect reads it: libpq
    keywords only, and its multi-host ``host``/``port`` forms with whole ports. The query
    starts where SQLAlchemy's does: after the host, a password may hold a "?"."""
    found = _SQLALCHEMY.match(url)
    pairs = parse_qsl((url[found.end() :] if found else url).partition("?")[2])
    unknown = sorted({key for key, _ in pairs} - LIBPQ_KEYWORDS)
    if unknown:
        raise ValueError(
            f"has {unknown[0][:40]!r} in its query, which is no libpq connection keyword"
            " (https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS)"
        )
    hosts = [value for key, value in pairs if key == "host"]
    given = [value for key, value in pairs if key == "port"]
    ports = given[0].split(",") if len(given) == 1 else given
    paired = len(hosts) > 1 or (  # host=h1:p1&host=h2:p2, or one host=h:p
        len(hosts) == 1 and ":" in hosts[0] and re.fullmatch(r"[\w.-]*:\d*", hosts[0])
    )
    if paired:
        if any(host.count(":") > 1 for host in hosts):
            raise ValueError("has a bad host=HOST:PORT in its query (one ':' a host)")
        if given:
            raise ValueError("mixes host=HOST:PORT and port= in its query: use one form")
        ports = [host.partition(":")[2] for host in hosts]
    for port in ports:
        if port and not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65_535):
            raise ValueError(f"has a bad port {port[:20]!r} in its query (1 to 65535)")
    named = len(hosts) if paired else len(hosts[0].split(",")) if hosts else 0
    if given and not paired and named != len(ports) and (named > 1 or len(ports) > 1):
        raise ValueError("names as many ports as hosts in its query (or one of each)")


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


# sqlalchemy.engine.url's own pattern (its _parse_url): userinfo ends at the first "@"
_SQLALCHEMY = re.compile(
    r"[\w+]+://(?P<userinfo>[^:/]*(?::[^@]*)?@)?"
    r"(?:(?P<v6>\[[^/?]+\])|(?P<host>[^/:?]+))?(?::(?P<port>[^/?]*))?"
)
# read by urllib.parse (kombu, redis-py): the netloc ends at "/", "?" or "#"
_URLLIB_READ = {"redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp", "librabbitmq", "rpc"}


def _sqlalchemy_host(url: str) -> tuple[str, str, bool]:
    """(host, port, whether a password's "@" spilled into them) as SQLAlchemy reads them."""
    found = _SQLALCHEMY.match(url)
    if found is None:
        raise ValueError("is not a URL SQLAlchemy reads, e.g. postgresql://u:pw@host:5432/db")
    if url[found.end() :][:1] not in ("", "/", "?"):  # "[::1]x": SQLAlchemy drops the x
        raise ValueError("has a bad host: an IPv6 address goes in brackets, like [::1]:5432")
    host, port = found["v6"] or found["host"] or "", found["port"]
    if port == "":  # "host:" with no port: SQLAlchemy's int("") raises
        raise ValueError("has a bad port '' (1 to 65535)")
    return host, port or "", "@" in url[found.end("userinfo") :].partition("?")[0]


def _urllib_host(rest: str) -> tuple[str, str, bool]:
    """(host, port, whether a password's "/", "?" or "#" ended the netloc) as urllib.parse
    reads them: after the netloc's last "@", a port after the first ":" (or after "]")."""
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    bracketed = netloc.partition("[")[2].partition("]")[0]
    if ("[" in netloc) != ("]" in netloc) or ("[" in netloc and not _ipv6(bracketed)):
        raise ValueError(  # urllib judges the first [...] of the netloc, a password's too
            "has a bad host: an IPv6 address goes in brackets, like [::1]:6379; percent-encode"
            " a password's [ ] (%5B %5D)"
        )
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("[") or "]" in hostport:
        host, close, after = hostport.partition("]")
        host, port = host + close, after.partition(":")[2] if close else ""
    else:
        host, _, port = hostport.partition(":")
    return host, port, "@" in rest[len(netloc) :]
