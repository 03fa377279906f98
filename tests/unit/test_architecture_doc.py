"""docs/architecture.md stays true to the code: its layout block names every module under
dtask/ in its package's section and no module that is not there; every path and every dotted
dtask name it mentions exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def layout() -> dict[str, str]:
    """The layout block's text by section: "" for top-level lines, "worker" for the lines
    under ``dtask/worker/`` (its own line and the indented ones after it), and so on."""
    text = DOC.read_text()
    block = text.split("## Layout and import rules", 1)[1].split("```", 2)[1]
    sections: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line[:1].strip():  # a line at the margin starts a section, or is a top-level one
            head = line.split()[0].removeprefix("dtask/")
            current = head.rstrip("/") if line.startswith("dtask/") and head.endswith("/") else ""
        sections[current] = sections.get(current, "") + line + "\n"
    return sections


def modules() -> list[tuple[str, str]]:
    """(section, file name) of every module under dtask/, migrations aside."""
    found = []
    for path in sorted((REPO / "dtask").rglob("*.py")):
        parts = path.relative_to(REPO / "dtask").parts
        if "migrations" in parts or (len(parts) > 1 and path.name.startswith("__")):
            continue
        found.append(("" if len(parts) == 1 else parts[0], path.name))
    return found


def named(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None


def test_the_layout_block_names_every_module_in_its_package() -> None:
    sections = layout()
    missing = [
        f"dtask/{section + '/' if section else ''}{name}"
        for section, name in modules()
        if not named(sections.get(section, ""), name)
    ]
    assert not missing, f"docs/architecture.md's layout block does not name {missing}"


def test_the_layout_block_names_no_module_that_is_not_there() -> None:
    absent = []
    for section, text in layout().items():
        folder = REPO / "dtask" / section
        for name in re.findall(r"(?<![\w./])(\w+\.py)\b", text):
            if section == "" and not (REPO / name).exists() and not (folder / name).exists():
                absent.append(name)
            elif section and not (folder / name).exists():
                absent.append(f"dtask/{section}/{name}")
    assert not absent, f"docs/architecture.md's layout block names {absent}, not in dtask/"


def test_every_path_and_dotted_name_the_document_mentions_exists() -> None:
    text = DOC.read_text().split("Before this layout", 1)[0]  # past layouts are history
    wrong = [
        path
        for path in set(re.findall(r"(?<![\w/])(dtask/[\w/]+(?:\.py)?)", text))
        if not (REPO / path).exists()
    ]
    for dotted in set(re.findall(r"`(dtask(?:\.\w+)+)", text)):
        if not _resolves(dotted):
            wrong.append(dotted)
    assert not wrong, f"docs/architecture.md mentions {sorted(wrong)}, which do not exist"


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a name in one (``dtask.worker.app.current``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False
