"""The README's fenced ``sh`` and ``python`` blocks, in order, for tests/acceptance/test_readme.py.

A block is run unless an HTML comment right before it (blank lines allowed) says otherwise:

    <!-- readme: skip: why it cannot run in the suite -->
    <!-- readme: file NAME -->     (the block is written to NAME instead: a module the next
                                    blocks import)

Blocks of other languages (or none: transcripts, synopses) are not code to run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!-- readme: (skip: (?P<why>.+?)|file (?P<file>\S+)) -->$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None = None  # why it is not run
    file: str | None = None  # written to this file instead of run

    @property
    def runs(self) -> bool:
        return self.language in ("sh", "python") and self.skip is None and self.file is None


def blocks(readme: Path) -> list[Block]:
    found: list[Block] = []
    lines = readme.read_text().splitlines()
    directive: dict[str, str | None] = {}
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i].strip())
        fence = _FENCE.match(lines[i])
        if match:
            directive = {"skip": match["why"], "file": match["file"]}
        elif fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            code = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(i + 1, fence[1], code, directive.get("skip"), directive.get("file")))
            directive, i = {}, end
        elif lines[i].strip():
            directive = {}  # a directive applies to the block right after it only
        i += 1
    return found
