"""`dtask up --reload`: notice when a template module's file changes (polling mtimes once a
second: no dependency, and template modules are few)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dtask import templating


def module_files(modules: tuple[str, ...]) -> list[Path]:
    """The .py files of ``modules`` (a package: every .py under it), from the current folder
    as the workers see it. ``find_spec`` imports a dotted name's parent packages here, never
    the modules themselves."""
    templating.current_folder_importable()
    files: list[Path] = []
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        origin = Path(spec.origin)
        files += sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
    return files


class Watch:
    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = modules
        self._seen = self._stamps()

    def _stamps(self) -> dict[Path, float]:
        stamps = {}
        for path in module_files(self.modules):
            try:
                stamps[path] = path.stat().st_mtime
            except OSError:
                continue
        return stamps

    def changed(self) -> list[Path]:
        """Files added, removed or modified since the last call."""
        now = self._stamps()
        changed = [p for p in now.keys() | self._seen.keys() if now.get(p) != self._seen.get(p)]
        self._seen = now
        return sorted(changed)
