"""Bounded input, the pure side: JSON sizes, storable text, trigger keys, a split consumed
lazily, typed parameters that refuse nan/inf and NUL, checkpoints over their limit."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.context import ChildContext
from dtask.domain.limits import (
    KEY_LENGTH,
    check_key,
    json_bytes,
    over_budget,
    short_at_peak,
    text_problem,
    worker_connections,
)
from dtask.domain.params import Param
from dtask.domain.splitting import check_specs
from dtask.exceptions import (
    InvalidCheckpoint,
    InvalidSplit,
    InvalidStart,
    InvalidVariables,
    TooManyChildren,
)


@given(st.text())
def test_text_is_storable_unless_it_holds_nul(text: str) -> None:
    assert (text_problem(text) is None) == ("\x00" not in text)


def test_undecodable_bytes_and_nul_are_named() -> None:
    assert text_problem(b"a\xffb".decode("utf-8", "surrogateescape")) == (
        "is not valid UTF-8 (undecodable bytes)"
    )
    assert text_problem("a\x00b") == "holds a NUL character"


def test_a_key_is_bounded_storable_and_not_a_schedules() -> None:
    assert check_key("k" * KEY_LENGTH, "run") == "k" * KEY_LENGTH
    for key, says in (
        ("k" * (KEY_LENGTH + 1), "the key is 301 characters, over the limit of 300"),
        ("a\x00b", "the key holds a NUL character"),
        ("schedule:nightly:2026-11-24T03:00:00Z", "reserved for schedule slots"),
        ("  ", "the key is empty"),
    ):
        with pytest.raises(InvalidStart, match=says):
            check_key(key, "run")


def test_json_bytes_counts_utf8_and_refuses_nan() -> None:
    assert json_bytes({"a": "é"}) == len('{"a":"é"}'.encode())
    with pytest.raises(ValueError):
        json_bytes({"a": math.nan})


def test_a_generator_split_is_consumed_lazily_and_stopped_past_the_maximum() -> None:
    made = itertools.count()

    def endless() -> Iterator[dict[str, int]]:
        for i in made:
            yield {"a": i}

    with pytest.raises(TooManyChildren, match="more than the maximum 1,000 children"):
        check_specs(endless(), max_children=1000)
    assert next(made) == 1001  # built 1,001 specs, not ten million
    assert check_specs(({"a": i} for i in range(3)), 3) == ['{"a":0}', '{"a":1}', '{"a":2}']
    assert check_specs(tuple({"a": i} for i in range(2)), 3) == ['{"a":0}', '{"a":1}']


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        ({"a": 1}, "must return a list (or another iterable, e.g. a generator) of dicts"),
        ("ab", "got str"),
        (7, "got int"),
        ([], "the split produced no children"),
        ([{"a": math.nan}], "child spec #0 is not JSON"),
        ([{"a": {1, 2}}], "child spec #0 is not JSON"),
        ([{"a": "x" * 70_000}], "child spec #0 is 70,008 bytes of JSON, over the limit of 65,536"),
    ],
)
def test_a_split_returning_something_else_is_refused(specs: object, says: str) -> None:
    with pytest.raises(InvalidSplit, match=re.escape(says)):
        check_specs(specs, 100)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("param", "value", "says"),
    [
        (Param(float, min=0, max=10), math.nan, "must be a finite number, got nan"),
        (Param(float), math.inf, "must be a finite number, got inf"),
        (Param(float), -math.inf, "must be a finite number, got -inf"),
        (Param(str), "a\x00b", "holds a NUL character"),
        (Param(str), "a\udcffb", "is not valid UTF-8"),
    ],
)
def test_parameters_refuse_what_postgresql_cannot_hold(
    param: Param, value: object, says: str
) -> None:
    with pytest.raises(InvalidVariables, match=says):
        param.check("x", value)


def test_a_long_bad_value_is_shown_cut() -> None:
    with pytest.raises(InvalidVariables) as caught:
        Param(int).parse("n", "9" * 5000)
    assert len(str(caught.value)) < 150 and str(caught.value).endswith("...")


def test_a_checkpoint_over_its_limit_or_not_json_fails_the_attempt_and_writes_nothing() -> None:
    written: list[object] = []
    ctx = ChildContext(
        run_id=1, index=2, attempt=1, checkpoint_state=None, writer=written.append,
        checkpoint_interval=1, checkpoint_every=10, max_checkpoint=100,
    )  # fmt: skip
    ctx.checkpoint({"done": 1})
    with pytest.raises(InvalidCheckpoint, match="run 1 child 2's checkpoint is 112 bytes of JSON"):
        ctx.checkpoint({"x": "y" * 104})
    with pytest.raises(InvalidCheckpoint, match="is not JSON"):
        ctx.checkpoint({"x": math.nan})
    assert written == [{"done": 1}] and ctx.checkpoint_state == {"done": 1}


def test_a_prefork_worker_holds_c_plus_2_connections_a_threads_one_its_pool() -> None:
    assert worker_connections(concurrency=8, per_process=4) == 2 + 8 == 10
    assert worker_connections(concurrency=8, per_process=40) == 10  # DB_POOL: clients, threads
    assert worker_connections(concurrency=64, per_process=4, forks=False) == 4
    assert worker_connections(concurrency=0, per_process=2) == 2


@given(st.integers(1, 500), st.integers(0, 10_000), st.integers(1, 10_000))
def test_a_worker_is_refused_exactly_when_it_does_not_fit_beside_the_connections_in_use(
    mine: int, in_use: int, usable: int
) -> None:
    limit = f"the server's max_connections of {usable + 3} leaves"
    refusal = over_budget(mine, in_use, usable, limit, "concurrency 8 (prefork pool)")
    assert (refusal is None) == (mine + in_use <= usable)
    if refusal is not None:
        assert f"that makes {mine + in_use}, over the {usable} {limit}:" in refusal
        assert "\n" not in refusal
        assert refusal.startswith(f"a worker of concurrency 8 (prefork pool) may hold {mine} ")


@given(st.integers(1, 500), st.lists(st.integers(1, 500), max_size=20), st.integers(1, 10_000))
def test_live_workers_that_could_exceed_the_server_at_their_busiest_are_a_warning(
    mine: int, others: list[int], usable: int
) -> None:
    warning = short_at_peak(mine, others, usable)
    assert (warning is None) == (mine + sum(others) <= usable)
    if warning is not None:
        assert f"{len(others)} live one(s) may hold {mine + sum(others)}" in warning
