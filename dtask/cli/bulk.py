"""`dtask submit TEMPLATE --from FILE.jsonl`: one run per line (`-`: stdin), through
``dtask.submit_many``. A line is a JSON object: the run's variables, or ``{"variables": {...},
"key": "..."}`` for a run with a trigger key. `--var` values are every line's defaults."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from dtask.cli.base import EXIT_BAD_INPUT, EXIT_OK
from dtask.domain.bulk import Outcome
from dtask.exceptions import InvalidVariables, RateLimited

Item = tuple[Any, str | None]


def submit_lines(
    template: str, source: str, defaults: dict[str, Any], as_json: bool, **options: Any
) -> int:
    """Submit each line's run; print what became of them (a JSON array of each item's
    outcome with ``as_json``), each refused line on stderr. Exit 0 when every line has its
    run, 2 when a line was invalid, 4 when only rate limits refused some."""
    from dtask.client.bulk import submit_items

    tty = sys.stderr.isatty()

    def progress(done: int) -> None:
        if tty:
            print(f"\rdtask: {done:,} runs submitted...", end="", file=sys.stderr, flush=True)

    numbers: list[int] = []  # each item's line number
    with _opened(source) as lines:
        found = submit_items(template, _items(lines, defaults, numbers), progress, **options)
    if tty:
        print(file=sys.stderr)
    if as_json:
        print(json.dumps([{**s.as_json(), "line": numbers[s.index]} for s in found]))
    counts = {o: sum(s.outcome is o for s in found) for o in Outcome}
    shown = ", ".join(f"{n:,} {o.value.replace('_', ' ')}" for o, n in counts.items() if n)
    print(f"{len(found):,} runs: {shown or 'none'}", file=sys.stderr if as_json else sys.stdout)
    for s in found:
        if not s.ok:
            print(f"line {numbers[s.index]}: {s.outcome.value}: {s.error}", file=sys.stderr)
    if counts[Outcome.INVALID]:
        return EXIT_BAD_INPUT
    refused = counts[Outcome.LIMIT_EXCEEDED] or counts[Outcome.BUSY]
    return RateLimited.exit_code if refused else EXIT_OK


def _items(lines: IO[str], defaults: dict[str, Any], numbers: list[int]) -> Iterator[Item]:
    """Each line's (variables, key), its number appended to ``numbers``; a line that is no
    JSON object is an item whose variables are its error (reported as invalid). Blank lines
    are skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        numbers.append(number)
        try:
            value = json.loads(line)
        except ValueError as exc:
            yield InvalidVariables(f"not JSON: {exc}"), None
            continue
        if not isinstance(value, dict):
            yield InvalidVariables("not a JSON object"), None
        elif isinstance(value.get("variables"), dict) and set(value) <= {"variables", "key"}:
            key = value.get("key")
            if key is not None and not isinstance(key, str):
                yield InvalidVariables("its key must be a string"), None
            else:
                yield {**defaults, **value["variables"]}, key
        else:
            yield {**defaults, **value}, None


@contextmanager
def _opened(source: str) -> Iterator[IO[str]]:
    if source == "-":
        yield sys.stdin
        return
    path = Path(source)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise InvalidVariables(f"--from {source}: cannot read it ({exc.strerror})") from None
    with handle:
        yield handle
