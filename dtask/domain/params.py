"""Typed template parameters: checked in Python, parsed from command-line text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dtask.domain.limits import text_problem
from dtask.exceptions import InvalidVariables, TemplateDefinitionError

_PARAM_TYPES: dict[type, str] = {int: "int", float: "float", str: "str", bool: "bool"}
_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


@dataclass(frozen=True)
class Param:
    """A typed template parameter, optionally bounded and optional."""

    type: type
    min: float | None = None
    max: float | None = None
    default: Any = None
    required: bool = True

    def __post_init__(self) -> None:
        if self.type not in _PARAM_TYPES:
            supported = ", ".join(_PARAM_TYPES.values())
            raise TemplateDefinitionError(
                f"parameter type {self.type!r} is not supported (use one of {supported})"
            )
        if self.default is not None:
            object.__setattr__(self, "required", False)

    @property
    def type_name(self) -> str:
        return _PARAM_TYPES[self.type]

    def check(self, name: str, value: Any) -> Any:
        """Return the value if it has this parameter's type and bounds; raise otherwise."""
        ok = isinstance(value, self.type) and not (self.type is int and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
            raise InvalidVariables(
                f"variable {name!r} must be {self.type_name}, got {type(value).__name__} {shown}"
            )
        if self.type is float and not math.isfinite(value):
            raise InvalidVariables(f"variable {name!r} must be a finite number, got {value!r}")
        if self.type is str and (problem := text_problem(value)) is not None:
            raise InvalidVariables(f"variable {name!r} {problem}")
        if self.min is not None and value < self.min:
            raise InvalidVariables(f"variable {name!r} must be >= {self.min}, got {value!r}")
        if self.max is not None and value > self.max:
            raise InvalidVariables(f"variable {name!r} must be <= {self.max}, got {value!r}")
        return value

    def parse(self, name: str, text: str) -> Any:
        """Turn command-line text into a value of this parameter's type."""
        try:
            if self.type is bool:
                lowered = text.strip().lower()
                if lowered not in _TRUE | _FALSE:
                    raise ValueError(text)
                return lowered in _TRUE
            if not text.isascii() and self.type in (int, float):
                raise ValueError(text)  # int() also takes full-width digits: a typo here
            if self.type is int:
                return int(text.strip().replace("_", ""))
            if self.type is float:
                return float(text)
            return text
        except ValueError:
            shown = repr(text) if len(text) <= 80 else repr(text[:77]) + "..."
            raise InvalidVariables(
                f"variable {name!r} must be {self.type_name}, got {shown}"
            ) from None


def as_param(name: str, spec: type | Param) -> Param:
    if isinstance(spec, Param):
        return spec
    if isinstance(spec, type):
        return Param(spec)
    raise TemplateDefinitionError(
        f"parameter {name!r}: expected a type or dtask.Param, got {spec!r}"
    )
