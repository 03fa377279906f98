"""``celery -A proj dtask ...``: the ``dtask`` command inside Celery's, for the app ``-A``
names (adopted with ``dtask.init_app`` if it was not yet). Installed through Celery's
``celery.commands`` entry point."""

from __future__ import annotations

from typing import Any

import click


@click.command(
    "dtask",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def dtask(ctx: click.Context, args: tuple[str, ...]) -> None:
    """dtask's commands for this app: celery -A proj dtask migrate|submit|status|runs|..."""
    from dtask.cli import main
    from dtask.worker.adopt import init_app
    from dtask.worker.app import current

    host: Any = ctx.obj.app
    # The app loads as `celery worker`, `beat` and `shell` load it before anything of the
    # team's is imported: its import_modules signal (Django's fixup sets Django up there, so
    # DTASK_TEMPLATES may import models), then its task modules.
    host.loader.import_default_modules()
    if current() is not host:
        init_app(host)
    ctx.exit(main(list(args)))
