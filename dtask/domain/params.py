"""Typed template parameters: checked in Python, parsed from command-line text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from dtask.domain.limits import shown, text_problem
from dtask.exceptions import InvalidVariables, TemplateDefinitionError

_PARAM_TYPES: dict[type, str] = {
    int: "int", float: "float", str: "str", bool: "bool", date: "date", datetime: "datetime"
}  # fmt: skip
_EXAMPLE: dict[type, str] = {date: "2026-03-01", datetime: "2026-03-01T09:00:00+01:00"}
# an int variable is stored as JSON and read back as a PostgreSQL bigint (a range's bounds)
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}


@dataclass(frozen=True)
class Param:
    """A typed template parameter, optionally bounded and optional."""

    type: type
    min: Any = None  # a number; for a date or datetime, one (or its ISO 8601 text)
    max: Any = None
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
        # a date's bounds are kept as ISO 8601 text (variables are JSON); any default is a value
        # the parameter itself takes (not an integer past a bigint, not NaN)
        for bound in ("min", "max", "default") if self.type in _EXAMPLE else ("default",):
            if getattr(self, bound) is None:
                continue
            try:
                object.__setattr__(self, bound, self.check(bound, getattr(self, bound)))
            except InvalidVariables as exc:
                said = str(exc).replace(f"variable {bound!r}", f"{self._a}'s {bound}")
                raise TemplateDefinitionError(said) from None
            except TypeError:  # bounds of another type than the parameter's
                raise TemplateDefinitionError(
                    f"{self._a}'s {bound} {shown(getattr(self, bound))} cannot be compared"
                    f" with its bounds {shown(self.min)} and {shown(self.max)}"
                ) from None

    @property
    def _a(self) -> str:
        return f"{'an' if self.type is int else 'a'} {self.type_name}"

    @property
    def type_name(self) -> str:
        return _PARAM_TYPES[self.type]

    def check(self, name: str, value: Any) -> Any:
        """Return the value if it has this parameter's type and bounds; raise otherwise. A date
        or datetime is returned as ISO 8601 text (a datetime with its offset)."""
        if self.type in _EXAMPLE:
            return self._moment(name, value)
        ok = isinstance(value, self.type) and not (self.type is int and isinstance(value, bool))
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value, ok = float(value), True
            except OverflowError:  # an integer past any float (1e308)
                raise InvalidVariables(
                    f"variable {name!r} must be a finite number, got {shown(value)}"
                ) from None
        if not ok:
            raise InvalidVariables(
                f"variable {name!r} must be {self.type_name}, got {type(value).__name__}"
                f" {shown(value)}"
            )
        if self.type is float and not math.isfinite(value):
            raise InvalidVariables(f"variable {name!r} must be a finite number, got {value!r}")
        if self.type is int and not INT_MIN <= value <= INT_MAX:
            raise InvalidVariables(
                f"variable {name!r} must be an int from {INT_MIN:,} to {INT_MAX:,},"
                f" got {shown(value)}"
            )
        if self.type is str and (problem := text_problem(value)) is not None:
            raise InvalidVariables(f"variable {name!r} {problem}")
        if self.min is not None and value < self.min:
            raise InvalidVariables(f"variable {name!r} must be >= {self.min}, got {shown(value)}")
        if self.max is not None and value > self.max:
            raise InvalidVariables(f"variable {name!r} must be <= {self.max}, got {shown(value)}")
        return value

    def _moment(self, name: str, value: Any) -> str:
        try:
            moment = _moment_of(self.type, value)
        except ValueError:
            raise InvalidVariables(
                f"variable {name!r} must be an ISO 8601 {self.type_name} like"
                f" {_EXAMPLE[self.type]}, got {shown(value)}"
            ) from None
        if isinstance(moment, datetime) and moment.utcoffset() is None:
            raise InvalidVariables(
                f"variable {name!r} must name its time zone, like {_EXAMPLE[datetime]} or"
                f" {_EXAMPLE[datetime][:19]}Z, got {moment.isoformat()!r}"
            )
        low = None if self.min is None else _moment_of(self.type, self.min)
        high = None if self.max is None else _moment_of(self.type, self.max)
        if low is not None and moment < low:
            raise InvalidVariables(
                f"variable {name!r} must be >= {self.min}, got {moment.isoformat()}"
            )
        if high is not None and moment > high:
            raise InvalidVariables(
                f"variable {name!r} must be <= {self.max}, got {moment.isoformat()}"
            )
        return moment.isoformat()

    def parse(self, name: str, text: str) -> Any:
        """Turn command-line text into a value of this parameter's type."""
        if self.type in _EXAMPLE:
            return self.check(name, text)
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
                number = float(text)
                if not math.isfinite(number):  # float("1e999") is inf: the text says why
                    raise InvalidVariables(
                        f"variable {name!r} must be a finite number, got {shown(text)}"
                    )
                return number
            return text
        except ValueError:
            raise InvalidVariables(
                f"variable {name!r} must be {self.type_name}, got {shown(text)}"
            ) from None


def _moment_of(kind: type, value: Any) -> date:
    """A date or a datetime from itself or its ISO 8601 text; ValueError otherwise."""
    if isinstance(value, str):
        text = value.strip()
        value = datetime.fromisoformat(text) if kind is datetime else date.fromisoformat(text)
    if not isinstance(value, date) or isinstance(value, datetime) != (kind is datetime):
        raise ValueError(value)
    return value


def as_param(name: str, spec: type | Param) -> Param:
    if isinstance(spec, Param):
        return spec
    if isinstance(spec, type):
        return Param(spec)
    raise TemplateDefinitionError(
        f"parameter {name!r}: expected a type or dtask.Param, got {spec!r}"
    )
