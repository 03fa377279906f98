"""Concurrency keys' pure part (dtask/domain/concurrency.py): what a template or submit may
name, and the key a run's variables render to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtask
from dtask.domain.concurrency import KEY_CHARS, Concurrency, check_concurrency, key_of
from dtask.exceptions import InvalidConcurrency, InvalidVariables, TemplateDefinitionError


def test_a_key_defaults_to_one_at_a_time_and_a_limit_needs_a_key() -> None:
    assert check_concurrency(None, None, "t", {"c"}) is None
    assert check_concurrency("${c}", None, "t", {"c"}) == Concurrency("${c}", 1)
    assert check_concurrency("fixed", 5, "t", set()) == Concurrency("fixed", 5)
    with pytest.raises(InvalidConcurrency, match="t: max_concurrent limits runs per"):
        check_concurrency(None, 2, "t", {"c"})


@pytest.mark.parametrize(
    ("key", "most", "message"),
    [
        ("", None, "concurrency_key must be text"),
        (7, None, "concurrency_key must be text"),
        ("${x}", None, "names x, not a parameter (parameters: c)"),
        ("${c}", 0, "max_concurrent must be a whole number from 1 to 10,000, got 0"),
        ("${c}", True, "got True"),
        ("${c}", 2.5, "got 2.5"),
    ],
)
def test_what_cannot_be_a_key_or_limit_says_so(key: object, most: object, message: str) -> None:
    with pytest.raises(InvalidConcurrency, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_concurrency(key, most, "t", {"c"})


def test_a_template_s_bad_key_is_a_definition_error() -> None:
    with pytest.raises(TemplateDefinitionError, match="template 'k': concurrency_key"):
        dtask.template("k", params={"a": int}, split=lambda r: [{}], concurrency_key="${b}")(
            lambda ctx: None
        )


@given(st.text(min_size=0, max_size=300))
def test_a_rendered_key_is_its_value_as_text_or_refused(value: str) -> None:
    limit = Concurrency("c:${c}")
    text = f"c:{value}"
    if "\x00" in text or len(text) > KEY_CHARS:
        with pytest.raises(InvalidVariables, match="a key is 1 to 200 characters"):
            key_of(limit, {"c": value}, "run")
    else:
        assert key_of(limit, {"c": value}, "run") == text


def test_a_whole_placeholder_of_another_type_is_its_json() -> None:
    assert key_of(Concurrency("${c}"), {"c": 42}, "run") == "42"
    assert key_of(Concurrency("${c}"), {"c": ["a", 1]}, "run") == '["a", 1]'
    with pytest.raises(InvalidVariables):
        key_of(Concurrency("${c}"), {"c": " "}, "run")
