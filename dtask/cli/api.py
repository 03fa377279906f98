"""`dtask serve` and `dtask token create|list|revoke`: the HTTP API and its keys."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dtask.cli.base import EXIT_OK, Parser, port, token_id


def register(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the HTTP API (every request needs a token)")
    serve.set_defaults(handler=_cmd_serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default loopback)"
    )
    serve.add_argument("--port", type=port, default=8000)

    token = sub.add_parser("token", help="manage the HTTP API's tokens")
    token.set_defaults(handler=_cmd_token)
    ops = token.add_subparsers(dest="op", required=True, parser_class=Parser)
    create = ops.add_parser("create", help="a token for a client; its secret is printed once")
    create.add_argument("--client", required=True)
    create.add_argument("--admin", action="store_true", help="sees and acts on every client's runs")
    create.add_argument("--json", action="store_true")
    listed = ops.add_parser("list", help="the tokens (never their secrets)")
    listed.set_defaults(reads_only=True)
    listed.add_argument("--json", action="store_true")
    revoke = ops.add_parser("revoke", help="a revoked token is refused at once")
    revoke.add_argument("id", type=token_id)


def _cmd_serve(args: argparse.Namespace) -> int:
    from dtask.services.extras import require

    require("fastapi", "api", "dtask serve (the HTTP API and the dashboard)")
    from dtask.api.server import serve

    serve(args.host, args.port)
    return EXIT_OK


def _cmd_token(args: argparse.Namespace) -> int:
    from dtask.client import tokens

    if args.op == "create":
        token, secret = tokens.create_token(args.client, args.admin)
        if args.json:
            print(json.dumps({**token.as_json(), "secret": secret}))
        else:
            print(secret)
            kind = "admin token" if token.admin else "token"
            print(
                f"{kind} {token.id} for client {token.client}: shown once, keep it secret",
                file=sys.stderr,
            )
    elif args.op == "list":
        found = tokens.list_tokens()
        if args.json:
            print(json.dumps([t.as_json() for t in found]))
            return EXIT_OK
        print(f"{'ID':>5}  {'CLIENT':<20} {'ADMIN':<5}  {'TOKEN':<12}  {'CREATED':<19}  REVOKED")
        for t in found:
            revoked = f"{t.revoked_at:%Y-%m-%d %H:%M:%S}" if t.revoked_at else "-"
            print(
                f"{t.id:>5}  {t.client:<20} {'yes' if t.admin else 'no':<5}  {t.hint:<12}"
                f"  {t.created_at:%Y-%m-%d %H:%M:%S}  {revoked}"
            )
    else:
        token = tokens.revoke_token(args.id)
        print(f"token {token.id} of client {token.client} revoked")
    return EXIT_OK
