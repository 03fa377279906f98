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

from dtask.cli import api, children, clients, graph, prune, runs, schedules, services
from dtask.cli.base import Parser, interrupted
from dtask.exceptions import DtaskError


def parser() -> argparse.ArgumentParser:
    top = Parser(prog="dtask", description=__doc__)
    sub = top.add_subparsers(dest="command", required=True, parser_class=Parser)
    for noun in (runs, children, graph, schedules, clients, services, prune, api):
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
    try:
        if argv[:1] == ["worker"]:  # every other option goes to `celery worker` as it is
            return services.run_worker(argv[1:])
        _stacks_on_sigusr1()
        args = parser().parse_args(argv)
        code: int = args.handler(args)
        return code
    except DtaskError as exc:
        if interrupted(exc):  # Ctrl-C in a database call, reported as the call's failure
            print("dtask: interrupted", file=sys.stderr)
            return 130
        print(f"dtask: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `dtask runs | head -1`: the reader left, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except BaseException as exc:
        if not interrupted(exc):
            raise
        print("dtask: interrupted", file=sys.stderr)
        return 130
