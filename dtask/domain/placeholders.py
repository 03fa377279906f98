"""Placeholders: ``${name}`` in a template's skeleton (and its concurrency key), filled
with a run's variables; ``$$`` is a literal ``$``."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

JSON = Any

PLACEHOLDER = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)\})")
_WHOLEPLACEHOLDER = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def placeholders(skeleton: JSON) -> set[str]:
    """Every ``${name}`` used anywhere in the skeleton (keys and values)."""
    found: set[str] = set()
    for text in _strings(skeleton):
        found.update(m.group(1) for m in PLACEHOLDER.finditer(text) if m.group(1))
    return found


def _strings(node: JSON) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list | tuple):
        for item in node:
            yield from _strings(item)


def render(skeleton: JSON, variables: Mapping[str, Any]) -> JSON:
    """Fill placeholders. A string that is exactly ``${name}`` takes the value with its type."""
    if isinstance(skeleton, str):
        whole = _WHOLEPLACEHOLDER.match(skeleton)
        if whole:
            return variables[whole.group(1)]
        return PLACEHOLDER.sub(
            lambda m: "$" if m.group(1) is None else str(variables[m.group(1)]), skeleton
        )
    if isinstance(skeleton, Mapping):
        return {render(k, variables): render(v, variables) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        return [render(item, variables) for item in skeleton]
    return skeleton
