"""Hypothesis strategies for the SHAPES of what callers hand dtask, not only its values (issue
58): URLs built from odd parts (IPv6 brackets open or shut, ports out of range or not numbers,
userinfo holding the URL's own delimiters, odd schemes), option spellings, numbers past any
float or bigint, TOML keys and nesting, and bodies of JSON text that Python would not write."""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import string
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

SCHEMES = [
    "postgresql", "postgresql+psycopg", "POSTGRESQL", "db+postgresql", "redis", "rediss",
    "redis+socket", "sentinel", "amqp", "pyamqp", "http", "https", "HTTP", "ftp", "file",
    "x-y.z", "1abc", "",
]  # fmt: skip
SEPARATORS = ["://", "://", "://", ":/", ":", ":///", ""]
USERINFO = [
    "", "", "u@", "u:p@", ":p@", "u:@", "@", "u:p@ss@", "u:p:ss@", "u:p/ss@", "u:p#ss@",
    "u:p?ss@", "u:%40%3A@", "u:[::1]@", "ü:ß@",
]  # fmt: skip
HOSTS = [
    "127.0.0.1", "localhost", "[::1]", "[::1", "::1]", "::1", "[zz]", "[::1]x", "h[1]", "",
    "h1:5432,h2", "[fe80::1%eth0]", "[v1.x]", "ex ample", "bücher.example", "h\x00", "..",
    "[]", "[[::1]]", "%5B::1%5D",
]  # fmt: skip
PORTS = [
    "", "", ":", ":0", ":1", ":6379", ":65535", ":65536", ":99999", ":-1", ":+1", ":x", ":\u0665",
    ":1:2", ":" + "9" * 30, ": 80", ":80 ", ":0x50",
]  # fmt: skip
TAILS = [
    "", "/", "/db", "//", "/0", "/x?y=1", "?a=b@c", "#frag", "/a b", "/%00", "?host=/tmp",
    "/db?sslmode=require", "/db?sslmode=zzz", "/db?host=a:1&host=b:2", "/db?host=a:1:2&host=b",
    "/db?port=1,2", "/db?host=a,b&port=1", "/db?host=a:5&port=6", "/db?connect_timeout=x",
    "/db?port=1,2&port=3", "/db?host=h:",
]  # fmt: skip
URL_BITS = "[]:@/?#%.;,0123456789abcxyz\\ \t"
URL_PART = st.one_of(st.sampled_from(HOSTS), st.text(alphabet=URL_BITS, max_size=12))


def url(schemes: list[str] | None = None) -> st.SearchStrategy[str]:
    """A URL put together from odd parts (or from sound ones, a third of the time: what is
    accepted matters most), sometimes two joined by ";" (kombu's failover)."""
    odd = st.builds(
        lambda *parts: "".join(parts),
        st.sampled_from(schemes or SCHEMES),
        st.sampled_from(SEPARATORS),
        st.sampled_from(USERINFO),
        URL_PART,
        st.sampled_from(PORTS),
        st.sampled_from(TAILS),
    )
    sound = st.builds(
        lambda *parts: "".join(parts),
        st.sampled_from(schemes or SCHEMES),
        st.just("://"),
        st.sampled_from(["", "u@", "u:p@", "u:%40%2F@", ":p@"]),
        st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[fe80::1%eth0]", "bücher.example"]),
        st.sampled_from(["", ":1", ":8080", ":65535"]),
        st.sampled_from(["", "/", "/hook", "/db?sslmode=require", "/0?x=1"]),
    )
    one = st.one_of(odd, odd, sound)
    return st.one_of(one, st.tuples(one, one).map(";".join))


# numbers past every bound, as command-line text and as JSON text (which json.dumps won't make)
HUGE_TEXT = ["1" + "0" * 400, "-" + "9" * 400, "9" * 4301, "1e400", "-1e400", "1e-400"]
NUMBER_TEXT = st.one_of(
    st.sampled_from(
        [*HUGE_TEXT, "9223372036854775808", "-9223372036854775809", "2147483648", "0", "-0",
         "1_000", "0x10", "1e3", " 5", "5 ", "NaN", "Infinity", "-Infinity", "nan", "inf", "\u0665"]
    ),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)  # fmt: skip

# how people (and scripts) spell an option: --name=value, --name value, an abbreviation
SPELLINGS = ["{o}={v}", "{o} {v}", "{o}= {v}", "{a}={v}", "{o}"]


def spelled(option: str, value: str) -> st.SearchStrategy[list[str]]:
    """``option`` given ``value`` in one of the spellings argparse takes (and some it refuses)."""
    short = option[: max(3, len(option) - 3)]

    def spell(form: str) -> list[str]:
        text = form.format(o=option, a=short, v="\x1f")
        return [part.replace("\x1f", value) for part in text.split(" ")]

    return st.sampled_from(SPELLINGS).map(spell)


# TOML: keys quoted or dotted, odd names, values of every type, tables nested deeper than used
TOML_KEY = st.one_of(
    st.sampled_from(["n", "a", "b", "type", "min", "max", "default", "x.y", "", " ", "é"]),
    st.text(alphabet=string.ascii_letters + string.digits + "_-. \"'\\[]=#\n", max_size=10),
)


def toml_value(depth: int = 2) -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=True, allow_infinity=True),
        st.booleans(),
        st.text(max_size=20),
        st.sampled_from(["int", "float", "str", "bool", "date", "datetime", "${n}", "${"]),
        st.dates(),
    )
    if depth == 0:
        return scalar
    inner = toml_value(depth - 1)
    return st.one_of(
        scalar,
        st.lists(inner, max_size=3),
        st.dictionaries(TOML_KEY, inner, max_size=3),
    )


def toml_key(key: str) -> str:
    """A key as TOML writes it: bare where it may be, else quoted (TOML escapes)."""
    bare = key and all(c in string.ascii_letters + string.digits + "_-" for c in key)
    if bare:
        return key
    escaped = key.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def toml_text(value: Any) -> str:
    """``value`` as a TOML value (inline tables and arrays: one line)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, str):
        escaped = json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
        return escaped.replace("\\/", "/")
    if isinstance(value, list):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_text(v)}" for k, v in value.items()) + "}"
    return str(value)  # a date: TOML's local date


def toml_file(name: str, table: dict[str, Any]) -> str:
    """One ``[template.NAME]`` table, each key on its own line."""
    lines = [f"[template.{toml_key(name)}]"]
    lines += [f"{toml_key(k)} = {toml_text(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def examples(default: int) -> int:
    """Examples a fuzz test runs: ``default`` in `make test`, DTASK_FUZZ_EXAMPLES when set."""
    return int(os.environ.get("DTASK_FUZZ_EXAMPLES") or default)


# What each fuzzed call became, by surface: `python -m tests.fuzz` sums it over its rounds
# (DTASK_FUZZ_TALLY names the JSON file a pytest process adds its counts to when it exits).
TALLY: Counter[str] = Counter()


def tally(surface: str, outcome: str) -> None:
    """``outcome``: ok, refused, traceback, http500 or created (a refused call that made rows)."""
    TALLY[f"{surface} {outcome}"] += 1


def _save_tally() -> None:
    path = os.environ.get("DTASK_FUZZ_TALLY")
    if not path or not TALLY:
        return
    file = Path(path)
    with file.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        saved = Counter(json.loads(handle.read() or "{}"))
        saved.update(TALLY)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(dict(sorted(saved.items())), indent=1))


atexit.register(_save_tally)
