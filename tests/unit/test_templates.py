from __future__ import annotations

import json
from typing import Any

import pytest

import dtask
from dtask.domain.templates import (
    Param,
    Registry,
    Template,
    TemplateOptions,
    check_execution_cap,
    placeholders,
    render,
)


def _noop(ctx: dtask.ChildContext, **spec: Any) -> None:
    return None


def make(**overrides: Any) -> Template:
    fields: dict[str, Any] = {
        "name": "t",
        "params": {"n": Param(int)},
        "skeleton": {"start": 1, "end": "${n}"},
        "split": dtask.RangeSplit("start", "end", chunk=10),
        "function": _noop,
    }
    fields.update(overrides)
    return Template(**fields)


@pytest.mark.parametrize(
    ("skeleton", "variables", "expected"),
    [
        ("${n}", {"n": 5}, 5),
        ("x-${n}", {"n": 5}, "x-5"),
        ("$${n}", {"n": 5}, "${n}"),
        ({"a": ["${n}", {"b": "${s}"}]}, {"n": 1, "s": "z"}, {"a": [1, {"b": "z"}]}),
        ({"${s}": "${f}"}, {"s": "k", "f": 1.5}, {"k": 1.5}),
        ({"plain": 3, "none": None}, {}, {"plain": 3, "none": None}),
        ("${flag}", {"flag": False}, False),
    ],
)
def test_render_fills_placeholders_keeping_types(
    skeleton: Any, variables: dict[str, Any], expected: Any
) -> None:
    assert render(skeleton, variables) == expected


def test_placeholders_found_in_keys_and_nested_values() -> None:
    assert placeholders({"${a}": ["${b}", "x${c}y", "$${d}"]}) == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({}, "needs 'n'"),
        ({"n": 1, "m": 2}, "has no parameter 'm'"),
        ({"n": "10"}, "'n' must be int, got str '10'"),
        ({"n": True}, "'n' must be int, got bool True"),
        ({"n": 1.5}, "'n' must be int"),
    ],
)
def test_validate_rejects_missing_extra_and_mistyped(
    variables: dict[str, Any], message: str
) -> None:
    with pytest.raises(dtask.InvalidVariables, match=message):
        make().validate(variables)


def test_validate_applies_bounds_and_defaults() -> None:
    tpl = make(
        params={"n": Param(int, min=1, max=10), "label": Param(str, default="x")},
        skeleton={"start": 1, "end": "${n}", "label": "${label}"},
    )
    assert tpl.validate({"n": 3}) == {"n": 3, "label": "x"}
    with pytest.raises(dtask.InvalidVariables, match=">= 1"):
        tpl.validate({"n": 0})
    with pytest.raises(dtask.InvalidVariables, match="<= 10"):
        tpl.validate({"n": 11})


def test_float_param_accepts_int() -> None:
    assert Param(float).check("x", 2) == 2.0


@pytest.mark.parametrize(
    ("param", "text", "value"),
    [
        (Param(int), "1_000", 1000),
        (Param(int), " -5 ", -5),
        (Param(float), "2.5", 2.5),
        (Param(bool), "yes", True),
        (Param(bool), "False", False),
        (Param(str), "abc", "abc"),
    ],
)
def test_parse_command_line_text(param: Param, text: str, value: Any) -> None:
    assert param.parse("v", text) == value


@pytest.mark.parametrize(("param", "text"), [(Param(int), "abc"), (Param(bool), "maybe")])
def test_parse_rejects_text_of_the_wrong_type(param: Param, text: str) -> None:
    with pytest.raises(dtask.InvalidVariables, match="must be"):
        param.parse("v", text)


def test_definition_errors_are_caught_at_registration() -> None:
    with pytest.raises(dtask.TemplateDefinitionError, match="not parameters"):
        make(skeleton={"end": "${missing}"})
    with pytest.raises(dtask.TemplateDefinitionError, match="template name"):
        make(name="has space")
    with pytest.raises(dtask.TemplateDefinitionError, match="not supported"):
        Param(list)
    with pytest.raises(dtask.TemplateDefinitionError, match="not JSON"):
        make(params={}, skeleton={"x": object()})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, "must be over 0 and at most 315,360,000 seconds, got 0"),
        (-1.5, "must be over 0 and at most 315,360,000 seconds, got -1.5"),
        (float("nan"), "must be over 0 and at most 315,360,000 seconds, got nan"),
        (float("inf"), "must be over 0 and at most 315,360,000 seconds, got inf"),
        ("5", "execution cap must be a number of seconds, got '5'"),
        (True, "execution cap must be a number of seconds, got True"),
        ([1], "execution cap must be a number of seconds, got [1]"),
    ],
)
def test_a_bad_execution_cap_is_refused_naming_where(value: Any, error: str) -> None:
    with pytest.raises(dtask.InvalidExecutionCap, match=r"^here: .*" + error.replace("[", r"\[")):
        check_execution_cap(value, "here")
    with pytest.raises(dtask.InvalidExecutionCap, match="template 't'"):
        make(options=TemplateOptions(execution_cap=value))


def test_an_execution_cap_is_seconds_or_none() -> None:
    assert check_execution_cap(None, "x") is None
    assert check_execution_cap(2, "x") == 2.0
    assert check_execution_cap(0.25, "x") == 0.25
    assert make(options=TemplateOptions(execution_cap=3)).options.execution_cap == 3


def test_plan_renders_and_splits() -> None:
    specs = [json.loads(s) for s in make().plan({"n": 25}, max_children=100)]
    assert specs == [{"a": 1, "b": 10}, {"a": 11, "b": 20}, {"a": 21, "b": 25}]


def test_plan_refuses_too_many_children_before_splitting() -> None:
    huge = make(split=dtask.RangeSplit("start", "end", chunk=1))
    with pytest.raises(dtask.TooManyChildren, match="1,000,000,000,000 children"):
        huge.plan({"n": 10**12}, max_children=100_000)


def test_plan_rejects_an_empty_range() -> None:
    with pytest.raises(dtask.InvalidVariables, match="empty"):
        make().plan({"n": -5}, max_children=100)


def test_custom_split_output_is_checked() -> None:
    not_json = make(split=lambda r: [{"a": object()}])
    with pytest.raises(dtask.InvalidSplit, match="not JSON"):
        not_json.plan({"n": 1}, max_children=10)
    nothing = make(split=lambda r: [])
    with pytest.raises(dtask.InvalidSplit, match="no children"):
        nothing.plan({"n": 1}, max_children=10)
    too_many = make(split=lambda r: [{"i": i} for i in range(11)])
    with pytest.raises(dtask.TooManyChildren):
        too_many.plan({"n": 1}, max_children=10)


class _CountingBug:
    def __call__(self, rendered: Any) -> list[dict[str, Any]]:
        return [{}]

    def count(self, rendered: Any) -> int:
        return int(rendered["nope"])


@pytest.mark.parametrize(
    ("split", "error"),
    [
        (lambda r: [{"a": r["missing"]}], "the split of template 't' raised KeyError: 'missing'"),
        (lambda r: 1 / 0, "raised ZeroDivisionError: division by zero"),
        (_CountingBug(), "the split of template 't' raised KeyError: 'nope'"),
    ],
)
def test_user_code_that_raises_fails_the_plan_with_a_dtask_error(split: Any, error: str) -> None:
    with pytest.raises(dtask.SplitFailed) as raised:
        make(split=split).plan({"n": 1}, max_children=10)
    assert error in str(raised.value)
    assert "\n" not in str(raised.value)


def test_registry_names_unknown_templates_and_refuses_clashes() -> None:
    reg = Registry()
    reg.add(make(name="one"))
    assert reg.get("one").name == "one"
    with pytest.raises(dtask.UnknownTemplate, match="unknown template 'two' \\(known: one"):
        reg.get("two")

    def other(ctx: dtask.ChildContext) -> None:
        return None

    with pytest.raises(dtask.TemplateDefinitionError, match="defined twice"):
        reg.add(make(name="one", function=other))


def test_sample_template_is_the_readme_example() -> None:
    import dtask.examples

    tpl = dtask.registry.get("print_range")
    assert json.loads(tpl.plan({"n": 100_000}, max_children=100_000)[-1]) == {
        "a": 99_001,
        "b": 100_000,
    }
    assert len(tpl.plan({"n": 100_000}, max_children=100_000)) == 100


def test_a_large_split_is_held_as_json_text_not_as_dicts() -> None:
    """The process that splits a million-child run holds every spec until they are inserted:
    as dicts (and a list of them from RangeSplit beside it) that took 520 MB; as text, 80."""
    import tracemalloc

    tpl = make(split=dtask.RangeSplit("start", "end", chunk=1))
    tracemalloc.start()
    try:
        specs = tpl.plan({"n": 100_000}, max_children=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak / len(specs) < 150, f"{peak / len(specs):.0f} bytes per child at the peak"
    assert len(specs) == 100_000 and json.loads(specs[-1]) == {"a": 100_000, "b": 100_000}
