"""Users' templates: the sample ones, the modules and TOML files named in DTASK_TEMPLATES.
Apart from dtask.services so that a command that only lists templates loads no database
driver."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path

from dtask import settings
from dtask.exceptions import ConfigurationError, DtaskError
from dtask.settings import Settings

_loaded_templates = False


def current_folder_importable() -> None:
    """Template modules are named from the folder a command runs in, as ``celery -A`` names
    its app: that folder on ``sys.path`` (a console script's path holds only its own)."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def load_templates(config: Settings | None = None) -> None:
    """Import the sample templates and every module named in DTASK_TEMPLATES, and load its
    TOML files of command templates (once). The current folder is importable, as it is for
    ``celery -A``; a relative TOML path is read from it."""
    global _loaded_templates
    if _loaded_templates:
        return
    importlib.import_module("dtask.examples")
    modules = (config or settings.load()).templates
    if modules:
        current_folder_importable()
    for module in modules:
        if module.endswith(".toml"):  # command templates (docs/commands.md)
            from dtask.templating import command_templates

            command_templates.load(Path(module).expanduser().absolute())
            continue
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"DTASK_TEMPLATES names {module!r}, which cannot be imported from"
                f" {os.getcwd()}: {exc}"
            ) from None
        except SyntaxError as exc:
            raise ConfigurationError(
                f"DTASK_TEMPLATES names {module!r}, which has a syntax error:"
                f" {exc.filename}:{exc.lineno}: {exc.msg}"
            ) from None
        except DtaskError:
            raise  # a template declared wrongly: its own one line
        except Exception as exc:  # the module's own code failed as it was imported
            raise ConfigurationError(
                f"DTASK_TEMPLATES names {module!r}, which raised {type(exc).__name__} as it"
                f" was imported ({_users_line(exc)}): {exc}"
            ) from None
    _loaded_templates = True


def _users_line(exc: BaseException) -> str:
    """Where the user's code raised: the deepest frame outside Python's and the installed
    packages' files (a KeyError of ``os.environ[...]`` names the template module's line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    outside = (sys.prefix, sys.base_prefix, "<")
    ours = [f for f in frames if not f.filename.startswith(outside)] or frames
    return f"{ours[-1].filename}:{ours[-1].lineno}"


def reset() -> None:
    """Load them again on the next call (tests that switch DTASK_TEMPLATES)."""
    global _loaded_templates
    _loaded_templates = False
