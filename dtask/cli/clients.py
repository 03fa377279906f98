"""`dtask client set|list|show|rm`: the clients of a shared dtask and their limits."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtask.cli.base import EXIT_OK, Parser, number
from dtask.domain.clients import Client, Tier
from dtask.exceptions import InvalidClient

WINDOW_ONLY = ("max_running", "weight")  # enforced by the dispatcher (DTASK_DISPATCH=window)


def register(sub: Any) -> None:
    client = sub.add_parser("client", help="manage clients: rate limits, concurrency, tiers")
    client.set_defaults(handler=_cmd_client)
    ops = client.add_subparsers(dest="op", required=True, parser_class=Parser)
    put = ops.add_parser(
        "set", help="create a client or change its settings (those not given keep their value)"
    )
    put.add_argument("name")
    put.add_argument("--rate", metavar="N/PERIOD", help="runs per s, m, h or d (none: no limit)")
    put.add_argument(
        "--child-rate", metavar="N/PERIOD", help="children per s, m, h or d (none: no limit)"
    )
    put.add_argument("--max-running", metavar="N", help="children running at once (none: any)")
    put.add_argument("--weight", metavar="W", help="share of the slots against other clients")
    put.add_argument("--tier", choices=[t.value for t in Tier])
    put.add_argument("--max-priority", metavar="P", help="highest priority its runs may ask")
    put.add_argument("--json", action="store_true")
    listed = ops.add_parser("list", help="list the clients")
    listed.set_defaults(reads_only=True)
    listed.add_argument("--json", action="store_true")
    show = ops.add_parser("show", help="show a client's settings and what it uses now")
    show.set_defaults(reads_only=True)
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    ops.add_parser("rm", help="remove a client (its runs stay)").add_argument("name")
    secret = ops.add_parser(
        "secret", help="print the secret its completion notifications are signed with"
    )
    secret.add_argument("name")
    secret.add_argument("--rotate", action="store_true", help="replace it with a new one")


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for name in ("rate", "child_rate"):
        text = getattr(args, name)
        if text is not None:
            changes[name] = None if text.lower() == "none" else text
    if args.max_running is not None:
        none = args.max_running.lower() == "none"
        changes["max_running"] = (
            None if none else number(args.max_running, int, "--max-running", InvalidClient)
        )
    if args.weight is not None:
        changes["weight"] = number(args.weight, float, "--weight", InvalidClient)
    if args.tier is not None:
        changes["tier"] = args.tier
    if args.max_priority is not None:
        changes["max_priority"] = number(args.max_priority, int, "--max-priority", InvalidClient)
    return changes


def _print(client: Client, as_json: bool) -> None:
    if as_json:
        print(json.dumps(client.as_json()))
        return
    shown = client.as_json()
    print(f"client {client.name}")
    for name in ("rate", "child_rate", "max_running", "weight", "tier", "max_priority"):
        value = shown[name]
        print(f"  {name:<14}{'no limit' if value is None else value}")
    for name, value in client.usage.items():
        print(f"  {name.replace('_', ' '):<20}{value}")


def _note_what_is_not_enforced(changes: dict[str, Any]) -> None:
    import sys

    from dtask import services

    def options(names: tuple[str, ...]) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if n in changes]

    if services.current().settings.dispatch != "window" and options(WINDOW_ONLY):
        print(
            f"dtask: note: {', '.join(options(WINDOW_ONLY))} saved; only the dispatcher"
            " enforces it (DTASK_DISPATCH=window, the default, on the workers)",
            file=sys.stderr,
        )


def _cmd_client(args: argparse.Namespace) -> int:

    from dtask.client import clients

    if args.op == "set":
        changes = _changes(args)
        client = clients.set_client(args.name, **changes)
        _print(client, args.json)
        _note_what_is_not_enforced(changes)
    elif args.op == "list":
        listed = clients.list_clients()
        if args.json:
            print(json.dumps([c.as_json() for c in listed]))
            return EXIT_OK
        print(f"{'NAME':<24} {'RATE':>10} {'CHILD RATE':>12} {'RUNNING':>8} {'WEIGHT':>7}  TIER")
        for c in listed:
            j = c.as_json()
            print(
                f"{c.name:<24} {j['rate'] or '-':>10} {j['child_rate'] or '-':>12}"
                f" {j['max_running'] or '-':>8} {j['weight']:>7g}  {j['tier']}"
            )
    elif args.op == "show":
        _print(clients.get_client(args.name), args.json)
    elif args.op == "secret":
        print(clients.webhook_secret(args.name, rotate=args.rotate))
    else:
        clients.remove_client(args.name)
        print(f"client {args.name} removed (its runs stay)")
    return EXIT_OK
