"""Start one of Celery's own commands (``worker``, ``beat``) for dtask's app without loading
Celery's whole command line: ``app.start`` imports every Celery command and its plugins
(Flower's, the REPL's), 0.2 s of CPU at each worker start here (`python -m bench.startup`). What
``celery``'s group does before a command runs is done here: the app's user options for the
command and its preload options, and a usage error as one line."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import click

from dtask.exceptions import Invalid


def start(app: Any, name: str, argv: Sequence[str]) -> int:
    with _without_highlighting():
        command = _command(name)
    options = [*app.user_options.get(name, ()), *app.user_options.get("preload", ())]
    known = {p.name for p in command.params}
    command.params.extend(o for o in options if o.name not in known)
    from celery.bin import base  # imported by _command

    consume = getattr(base, "consume_preload_options", None)  # Celery 5.4's commands do it
    if app.user_options.get("preload") and consume is not None:
        command.callback = consume(command.callback)

    context = base.CLIContext(app=app, no_color=None, workdir=None, quiet=False)
    try:
        result = command.main(
            args=list(argv), prog_name=f"dtask {name}", obj=context, standalone_mode=False
        )
    except click.ClickException as exc:
        raise Invalid(f"{name}: {exc.format_message()}") from None
    return int(result) if isinstance(result, int) else 0  # --help's exit code too, from click


def _command(name: str) -> click.Command:
    if name == "worker":
        from celery.bin.worker import worker as command
    else:
        from celery.bin.beat import beat as command
    assert isinstance(command, click.Command)
    return command


@contextlib.contextmanager
def _without_highlighting() -> Iterator[None]:
    """Celery's command module builds pygments' Python lexer at import where pygments is
    installed (as pytest installs it): 112 regular expressions, 0.12 s of CPU at each worker's
    start here, for output a worker never highlights. Hidden while it imports, it falls back
    to plain text; anything imported later finds pygments as it is."""
    hidden = ("pygments", "pygments.formatters", "pygments.lexers")
    if any(name in sys.modules for name in (*hidden, "celery.bin.base")):
        yield
        return
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        for name in hidden:
            sys.modules.pop(name, None)
