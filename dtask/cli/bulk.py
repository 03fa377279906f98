"""`dtask submit TEMPLATE --from FILE.jsonl`: one run per line (`-`: stdin), through
``dtask.submit_many``. A line is a JSON object: the run's variables, or ``{"variables": {...},
"key": "..."}`` for a run with a trigger key. `--var` values are every line's defaults.

The whole input is checked before its first run is written (stdin is kept in a temporary file
for that): a line that is no run refuses the file, nothing created, each such line named. The
runs are then written a chunk at a time; where something stops that (PostgreSQL gone, Ctrl-C),
one line says which lines have their runs and which were not submitted."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import IO, Any

from dtask.cli.base import EXIT_BAD_INPUT, EXIT_OK, interrupted, one_line
from dtask.domain.bulk import Outcome, Submitted
from dtask.domain.limits import KEY_LENGTH
from dtask.exceptions import DtaskError, InvalidVariables, RateLimited

Item = tuple[Any, str | None]
NAMED = 20  # invalid lines named one by one; the others are counted
_SKIP = 1 << 20  # bytes read at a time past a line's bound, to find its end


def submit_lines(
    template: str, source: str, defaults: dict[str, Any], as_json: bool, **options: Any
) -> int:
    """Submit each line's run; print what became of them (a JSON array of each item's
    outcome with ``as_json``), each refused line on stderr. Exit 0 when every line has its
    run, 2 when a line was invalid (then nothing is submitted), 4 when only rate limits or
    the backlog cap refused some."""
    from dtask import services
    from dtask.client.bulk import invalid_items, submit_items

    # a line holds a run's variables (spaced as people write JSON) and its key
    most = 2 * services.current().settings.max_variables + 4 * KEY_LENGTH + 1024
    with _opened(source) as handle:
        numbers: list[int] = []  # each item's line number
        bad: list[tuple[int, DtaskError]] = []  # the first NAMED (all with --json)
        count = 0
        try:
            for i, exc in invalid_items(
                template, _items(handle, defaults, numbers, most), **options
            ):
                count += 1
                if as_json or len(bad) < NAMED:
                    bad.append((numbers[i], exc))
        except DtaskError:
            raise
        except Exception as exc:  # no item's own refusal: said for its line, never a traceback
            where = f"line {numbers[-1]}: " if numbers else ""
            raise InvalidVariables(f"{where}{_why(exc)}; nothing was submitted") from exc
        if count:
            return _refused(bad, count, len(numbers), as_json)
        handle.seek(0)
        tty = sys.stderr.isatty()

        def progress(done: int) -> None:
            if tty:
                print(f"\rdtask: {done:,} runs submitted...", end="", file=sys.stderr, flush=True)

        found: list[Submitted] = []
        try:
            items = islice(_items(handle, defaults, [], most), len(numbers))  # as checked
            submit_items(template, items, progress, found, **options)
        except BaseException as exc:
            if tty:
                print(file=sys.stderr)
            return _stopped(exc, found, numbers, as_json)
    if tty:
        print(file=sys.stderr)
    return _report(found, numbers, as_json)


def _report(found: list[Submitted], numbers: list[int], as_json: bool) -> int:
    if as_json:
        print(json.dumps([{**s.as_json(), "line": numbers[s.index]} for s in found]))
    counts = {o: sum(s.outcome is o for s in found) for o in Outcome}
    shown = ", ".join(f"{n:,} {o.value.replace('_', ' ')}" for o, n in counts.items() if n)
    print(f"{len(found):,} runs: {shown or 'none'}", file=sys.stderr if as_json else sys.stdout)
    for s in found:
        if not s.ok:
            print(
                f"line {numbers[s.index]}: {s.outcome.value}: {one_line(str(s.error))}",
                file=sys.stderr,
            )
    if counts[Outcome.INVALID]:
        return EXIT_BAD_INPUT
    refused = counts[Outcome.LIMIT_EXCEEDED] or counts[Outcome.BUSY]
    return RateLimited.exit_code if refused else EXIT_OK


def _refused(bad: list[tuple[int, DtaskError]], count: int, total: int, as_json: bool) -> int:
    """A file with ``count`` lines that are no runs: each named (the first NAMED), nothing
    submitted."""
    if as_json:
        print(json.dumps([{"line": n, "outcome": "invalid", "error": str(e)} for n, e in bad]))
    for number, exc in bad[:NAMED]:
        print(f"line {number}: invalid: {one_line(str(exc))}", file=sys.stderr)
    more = f" ({count - NAMED:,} more not shown)" if count > NAMED else ""
    print(
        f"dtask: error: {count:,} of {total:,} lines are no runs{more}: nothing was"
        " submitted; fix them and submit the file again",
        file=sys.stderr,
    )
    return EXIT_BAD_INPUT


def _stopped(exc: BaseException, found: list[Submitted], numbers: list[int], as_json: bool) -> int:
    """What the lines written before ``exc`` became, then one line: which have their runs,
    which were not submitted."""
    if found:
        _report(found, numbers, as_json)
    ok = [s for s in found if s.ok]
    left = numbers[len(found) :]
    parts = []
    if ok:
        ids = sorted({s.run_id for s in ok if s.run_id is not None})
        parts.append(
            f"{_lines([numbers[s.index] for s in ok], numbers)} have their runs"
            f" ({_spans(ids, 'run', 'runs')})"
        )
    if left:
        parts.append(f"{_lines(left, numbers)} were not submitted")
    said = "; ".join(parts) if ok else "nothing was submitted"
    print(f"dtask: error: {one_line(_why(exc))}: {said}", file=sys.stderr)
    if interrupted(exc):
        return 130
    return exc.exit_code if isinstance(exc, DtaskError) else EXIT_BAD_INPUT


def _why(exc: BaseException) -> str:
    if interrupted(exc):
        return "interrupted"
    if isinstance(exc, DtaskError):
        return str(exc)
    first = (str(exc).splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _lines(these: list[int], numbers: list[int]) -> str:
    """Line numbers as spans of consecutive items (blank lines between them do not split)."""
    place = {n: i for i, n in enumerate(numbers)}
    spans: list[tuple[int, int]] = []
    for n in these:
        if spans and place[n] == place[spans[-1][1]] + 1:
            spans[-1] = (spans[-1][0], n)
        else:
            spans.append((n, n))
    return _shown_spans(spans, "line", "lines")


def _spans(values: list[int], one: str, many: str) -> str:
    spans: list[tuple[int, int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    return _shown_spans(spans, one, many)


def _shown_spans(spans: list[tuple[int, int]], one: str, many: str) -> str:
    word = one if spans == [(spans[0][0], spans[0][0])] else many
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:4]]
    if len(spans) > 4:
        shown.append(f"... ({len(spans) - 4:,} more spans; --json lists each)")
    return f"{word} {', '.join(shown)}"


def _items(
    handle: IO[bytes], defaults: dict[str, Any], numbers: list[int], most: int
) -> Iterator[Item]:
    """Each line's (variables, key), its number appended to ``numbers``; a line that is no
    JSON object, not UTF-8 or over ``most`` bytes is an item whose variables are its error
    (reported as invalid). Blank lines are skipped."""
    number = 0
    while raw := handle.readline(most + 1):
        number += 1
        if len(raw) > most and not raw.endswith(b"\n"):
            while (rest := handle.readline(_SKIP)) and not rest.endswith(b"\n"):
                pass
            numbers.append(number)
            yield InvalidVariables(f"the line is over {most:,} bytes (DTASK_MAX_VARIABLES)"), None
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            numbers.append(number)
            yield InvalidVariables(f"not UTF-8 text (byte {exc.start + 1})"), None
            continue
        if not line.strip():
            continue
        numbers.append(number)
        yield _item(line, defaults)


def _item(line: str, defaults: dict[str, Any]) -> Item:
    try:
        value = json.loads(line)
    except ValueError as exc:
        return InvalidVariables(f"not JSON: {str(exc)[:200]}"), None
    except RecursionError:
        return InvalidVariables("not JSON this deep (nested past Python's recursion)"), None
    if not isinstance(value, dict):
        return InvalidVariables("not a JSON object"), None
    if isinstance(value.get("variables"), dict) and set(value) <= {"variables", "key"}:
        key = value.get("key")
        if key is not None and not isinstance(key, str):
            return InvalidVariables("its key must be a string"), None
        return {**defaults, **value["variables"]}, key
    return {**defaults, **value}, None


@contextmanager
def _opened(source: str) -> Iterator[IO[bytes]]:
    """The input as bytes that can be read twice: the file, or a temporary copy of stdin (or
    of a pipe named as a file)."""
    if source == "-":
        given: IO[bytes] | None = getattr(sys.stdin, "buffer", None)
        with tempfile.TemporaryFile() as copy:  # stdin stays open: this process's, not ours
            if given is not None:
                shutil.copyfileobj(given, copy)
            else:  # a text stream put in its place (a test's)
                for line in sys.stdin:
                    copy.write(line.encode("utf-8", "surrogateescape"))
            copy.seek(0)
            yield copy
        return
    path = Path(source)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InvalidVariables(f"--from {source}: cannot read it ({exc.strerror})") from None
    with handle:
        if handle.seekable():
            yield handle
            return
        with tempfile.TemporaryFile() as copy:
            shutil.copyfileobj(handle, copy)
            copy.seek(0)
            yield copy
