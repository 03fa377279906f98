"""The ``dtask`` command. Exit codes: 0 ok, 1 the run failed, 2 bad input or unreachable service,
3 a wait timed out (or `dtask result` of an unfinished run), 4 a client's limit exceeded
(retry later). Errors are one line on stderr,
never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from dtask.cli.base import Parser, interrupted, one_line
from dtask.exceptions import DtaskError


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return f"dtask {installed('dtask')}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "dtask (not installed)"


class _Version(argparse.Action):
    """``--version`` after other options: the version is read only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version())
        parser.exit()


def parser() -> argparse.ArgumentParser:
    # the nouns import dtask's settings and clients: only a command that parses pays for them
    from dtask.cli import api, children, clients, graph, logs, prune, runs, schedules, services

    top = Parser(prog="dtask", description=__doc__)
    top.add_argument("--version", action=_Version)
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    for noun in (runs, children, logs, graph, schedules, clients, services, prune, api):
        noun.register(sub)
    return top


def commands() -> set[str]:
    """Every subcommand's name (`dtask worker` included)."""
    found = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(found[0].choices)


def _templates_option(argv: list[str]) -> list[str]:
    """``--templates MODULES`` on any command (worker included) is DTASK_TEMPLATES for it."""
    rest, args = [], iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name == "--templates":
            os.environ["DTASK_TEMPLATES"] = value if eq else next(args, "")
        else:
            rest.append(arg)
    return rest


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints where each thread of a command that seems stuck is (where
    stderr is a file: not when main() runs inside a test's captured output)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = _templates_option(list(sys.argv[1:] if argv is None else argv))
    if argv == ["--version"]:  # at once, before any noun is imported
        print(version())
        return 0
    try:
        if argv[:1] == ["worker"]:  # every other option goes to `celery worker` as it is
            from dtask.cli import services

            return services.run_worker(argv[1:])
        _stacks_on_sigusr1()
        args = parser().parse_args(argv)
        if not getattr(args, "reads_only", False):
            return int(args.handler(args))
        from dtask.services import attach_only  # here: a command that needs no service skips it

        with attach_only():  # never starts the embedded services
            code: int = args.handler(args)
        return code
    except DtaskError as exc:
        if interrupted(exc):  # Ctrl-C in a database call, reported as the call's failure
            print("dtask: interrupted", file=sys.stderr)
            return 130
        print(f"dtask: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `dtask runs | head -1`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except BaseException as exc:
        if not interrupted(exc):
            raise
        print("dtask: interrupted", file=sys.stderr)
        return 130
