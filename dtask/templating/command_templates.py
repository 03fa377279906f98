"""Templates declared in a TOML file (an entry of DTASK_TEMPLATES ending in ``.toml``), each
running a command per child (dtask/templating/commands.py): no Python needed. Checked when
loaded, like a Python template: an unknown key, a wrong type, a placeholder that names no
parameter is one line naming the file and the key::

    [template.resize]
    params = { n = "int", folder = { type = "str", default = "in" } }
    skeleton = { start = 1, end = "${n}", folder = "${folder}" }
    split = { range = ["start", "end"], chunk = 100, carry = ["folder"] }
    command = ["./bin/resize", "--from", "${a}", "--to", "${b}", "--in", "${folder}"]
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dtask import settings
from dtask.domain.clients import Tier
from dtask.domain.commands import GRACE, Command
from dtask.domain.params import Param
from dtask.domain.splitting import RangeSplit, SplitStrategy
from dtask.domain.templates import Template, TemplateOptions, registry
from dtask.exceptions import DtaskError, TemplateDefinitionError
from dtask.templating.commands import CommandChild

TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}
KEYS = {
    "params", "skeleton", "split", "command", "shell", "env", "cwd", "grace", "queue", "tier",
    "max_attempts", "execution_cap", "delay_tolerance", "stealable", "env_pass", "protocol",
}  # fmt: skip
SPLIT_KEYS = {"range", "chunk", "parts", "carry"}
MAX_GRACE = 3600  # seconds from SIGTERM to SIGKILL: an hour, like the other stop bounds


def load(path: Path) -> list[Template]:
    """Every ``[template.NAME]`` table of the file, registered; nothing is registered when
    one of them is wrong."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TemplateDefinitionError(f"{path}: cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TemplateDefinitionError(f"{path}: not TOML: {exc}") from None
    except ValueError as exc:  # an integer past Python's 4,300 digits
        raise TemplateDefinitionError(f"{path}: not readable TOML: {exc}") from None
    except RecursionError:
        raise TemplateDefinitionError(f"{path}: not readable TOML: nested too deep") from None
    extra = sorted(set(data) - {"template"})
    if extra:
        raise TemplateDefinitionError(
            f"{path}: unknown key {extra[0]!r} (templates go in [template.NAME])"
        )
    tables = data.get("template", {})
    if not isinstance(tables, dict) or not tables:
        raise TemplateDefinitionError(f"{path}: no [template.NAME] table")
    made = [_template(path, name, table) for name, table in tables.items()]
    for template in made:
        registry.add(template)
    return made


def _template(path: Path, name: str, table: Any) -> Template:
    where = f"{path}: template {name!r}"
    if not isinstance(table, dict):
        raise TemplateDefinitionError(f"{where}: must be a table")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise TemplateDefinitionError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(KEYS))})"
        )
    for required in ("params", "skeleton", "split", "command"):
        if required not in table:
            raise TemplateDefinitionError(f"{where}: needs {required!r}")
    get = _getter(where, table)
    split, spec_keys = _split(where, get("split", dict))
    cwd = get("cwd", str, None)
    command = _command(
        where,
        lambda: Command(
            argv=tuple(get("command", list)),
            shell=get("shell", bool, False),
            env={k: _text(where, f"env.{k}", v) for k, v in get("env", dict, {}).items()},
            env_pass=_passed(where, get("env_pass", list, [])),
            protocol=get("protocol", str, "fd"),
            cwd=str((path.parent / cwd) if cwd is not None else path.parent),
            grace=_grace(where, get("grace", (int, float), GRACE)),
            stealable=get("stealable", bool, False),
        ),
    )
    missing = sorted(command.names() - spec_keys) if spec_keys is not None else []
    if missing:
        raise TemplateDefinitionError(
            f"{where}: command: ${{{missing[0]}}} names no key of a child's spec"
            f" ({', '.join(sorted(spec_keys or ()))})"
        )
    tier = get("tier", str, None)
    options = TemplateOptions(
        max_attempts=get("max_attempts", int, 3),
        queue=get("queue", str, None),
        execution_cap=get("execution_cap", (int, float), None),
        delay_tolerance=get("delay_tolerance", (int, float), None),
        tier=None if tier is None else _tier(where, tier),
        stealable=command.stealable,  # only a command that reads its end back (commands.md)
    )
    try:
        return Template(
            name=name,
            params=_params(where, get("params", dict)),
            skeleton=get("skeleton", (dict, list, str, int, float, bool)),
            split=split,
            function=CommandChild(command, f"{path}[template.{name}]"),
            options=options,
        )
    except TemplateDefinitionError as exc:
        raise TemplateDefinitionError(f"{path}: {exc}") from None


def _getter(where: str, table: Mapping[str, Any]) -> Callable[..., Any]:
    missing = object()

    def get(key: str, kind: type | tuple[type, ...], default: Any = missing) -> Any:
        if key not in table:
            return None if default is missing else default
        value = table[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int, float))):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            got = f"{type(value).__name__} {value!r:.60}"
            raise TemplateDefinitionError(f"{where}: {key} must be {_toml_name(names)}, got {got}")
        return value

    return get


def _toml_name(python: str) -> str:
    return python.replace("dict", "a table").replace("list", "an array").replace("str", "a string")


def _text(where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TemplateDefinitionError(f"{where}: {key} must be a string, got {value!r:.60}")
    return value


def _grace(where: str, value: float) -> float:
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not 0 <= seconds <= MAX_GRACE:
        raise TemplateDefinitionError(
            f"{where}: grace must be 0 to {MAX_GRACE:,} seconds, got {str(value)[:40]}"
        )
    return seconds


def _passed(where: str, names: list[Any]) -> tuple[str, ...]:
    for name in names:
        text = _text(where, "env_pass", name)
        if text.upper() in settings.KNOWN or text.upper().startswith("DTASK_SECRETS"):
            raise TemplateDefinitionError(
                f"{where}: env_pass: {text} is a dtask setting, never passed to a command"
                " (a worker's settings hold the database's and the broker's credentials)"
            )
    return tuple(names)


def _command(where: str, make: Callable[[], Command]) -> Command:
    try:
        return make()
    except TemplateDefinitionError as exc:
        raise TemplateDefinitionError(f"{where}: {exc}") from None


def _params(where: str, table: Mapping[str, Any]) -> dict[str, Param]:
    params: dict[str, Param] = {}
    for name, spec in table.items():
        fields = {"type": spec} if isinstance(spec, str) else spec
        if not isinstance(fields, dict) or not isinstance(fields.get("type"), str):
            raise TemplateDefinitionError(
                f'{where}: params.{name} must be a type name ("int") or a table with type ='
            )
        unknown = sorted(set(fields) - {"type", "min", "max", "default"})
        if unknown:
            raise TemplateDefinitionError(f"{where}: params.{name}: unknown key {unknown[0]!r}")
        kind = TYPES.get(fields["type"])
        if kind is None:
            raise TemplateDefinitionError(
                f"{where}: params.{name}: type {fields['type']!r} is not one of {', '.join(TYPES)}"
            )
        try:
            params[name] = Param(kind, fields.get("min"), fields.get("max"), fields.get("default"))
        except DtaskError as exc:
            raise TemplateDefinitionError(f"{where}: params.{name}: {exc}") from None
    return params


def _split(where: str, table: Mapping[str, Any]) -> tuple[SplitStrategy, set[str] | None]:
    """The split, and the keys of each child's spec (None where they are not known)."""
    unknown = sorted(set(table) - SPLIT_KEYS)
    if unknown:
        raise TemplateDefinitionError(
            f"{where}: split: unknown key {unknown[0]!r} (known: {', '.join(sorted(SPLIT_KEYS))})"
        )
    bounds = table.get("range")
    if not (
        isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, str) for b in bounds)
    ):
        raise TemplateDefinitionError(
            f'{where}: split.range must name the skeleton\'s two bounds: range = ["start", "end"]'
        )
    carry = table.get("carry", [])
    if not (isinstance(carry, list) and all(isinstance(c, str) for c in carry)):
        raise TemplateDefinitionError(f"{where}: split.carry must be an array of skeleton keys")
    try:
        split = RangeSplit(
            bounds[0], bounds[1], chunk=table.get("chunk", 1000), parts=table.get("parts"),
            carry=tuple(carry),
        )  # fmt: skip
    except (DtaskError, TypeError) as exc:
        raise TemplateDefinitionError(f"{where}: split: {exc}") from None
    return split, {split.a, split.b, *split.carry}


def _tier(where: str, name: str) -> Tier:
    try:
        return Tier(name)
    except ValueError:
        tiers = ", ".join(t.value for t in Tier)
        raise TemplateDefinitionError(f"{where}: tier {name!r} is not one of {tiers}") from None
