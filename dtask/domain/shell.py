"""A ``shell = true`` command line with its placeholders made the script's arguments: the
values never become shell text. ``echo "hello ${name}" > ${out}`` runs as
``sh -c 'echo "hello ${1}" > "${2}"' sh NAME OUT``: the shell expands ``${1}`` as a parameter,
whose value it never parses again, wherever it stands.

Each placeholder is written for the quoting it stands in: unquoted ``"${N}"`` (one word),
inside double quotes ``${N}``, inside single quotes ``'"${N}"'`` (closing and reopening them).
Where the shell would evaluate the value again or not expand it (arithmetic ``$((...))``,
inside a ``${...}`` expansion, a here-document), the line is refused when it is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from dtask.domain.placeholders import PLACEHOLDER
from dtask.exceptions import TemplateDefinitionError

# where a placeholder may not stand: inside arithmetic, a ${...} expansion, a here-document's
# line or body (to the end of the line's text), right after a backslash
_REFUSED = {
    "$((": "inside $((...)): arithmetic evaluates its text again",
    "${": "inside a ${...} expansion: its quoting differs between shells",
    "<<": "after << (a here-document): its body is not expanded as a word",
    "\\": "right after a backslash, which would quote the value's opening quote",
}


@dataclass(frozen=True)
class Script:
    """The script's text and, for each ``${N}`` (1-based), the spec key whose value it is."""

    text: str
    names: tuple[str, ...]


def script(line: str) -> Script:
    """``line`` (placeholders ``${key}``, ``$$`` for a ``$``) as a script whose placeholders
    are its positional parameters; TemplateDefinitionError for one that stands where a value
    would not stay data."""
    pieces: list[str | None] = []  # the line's own text, None where a placeholder stands
    found: list[str] = []
    at = 0
    for match in PLACEHOLDER.finditer(line):
        pieces.append(line[at : match.start()])
        at = match.end()
        if match.group(1) is None:  # $$: a $ of the shell's own
            pieces.append("$")
        else:
            pieces.append(None)
            found.append(match.group(1))
    pieces.append(line[at:])
    text = "".join(_MARK if p is None else p for p in pieces)
    names: list[str] = []
    out: list[str] = []
    places = iter(zip(found, _contexts(text), strict=True))
    for piece in pieces:
        if piece is not None:
            out.append(piece)
            continue
        name, context = next(places)
        if context in _REFUSED:
            raise TemplateDefinitionError(
                f"${{{name}}} stands {_REFUSED[context]}; with shell = true a placeholder must"
                " be a word of its own or inside quotes (its value reaches the script as"
                ' "$1", never as shell text)'
            )
        if name not in names:
            names.append(name)
        n = names.index(name) + 1
        out.append({'"': f"${{{n}}}", "'": f"'\"${{{n}}}\"'"}.get(context, f'"${{{n}}}"'))
    return Script("".join(out), tuple(names))


_MARK = "\ue000"  # where a placeholder stands, while the line is scanned: a word's character


def _contexts(text: str) -> list[str]:
    """POSIX sh's quoting, as far as a placeholder's place needs: for each _MARK, the quote
    or expansion it stands in (innermost; a refused one wherever it is open)."""
    stack: list[str] = []
    depth: list[int] = []  # open parentheses inside each "$(" (a subshell's, a case's)
    found: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        top = stack[-1] if stack else ""
        i += 1
        if c == _MARK:
            found.append(_context(stack))
        elif top == "'":
            if c == "'":
                stack.pop()
        elif top == "<<":
            continue
        elif c == "\\":
            if text[i : i + 1] == _MARK:
                found.append("\\")
            i += 1  # the next character is quoted
        elif c == "$" and text.startswith("((", i):
            stack.append("$((")
            depth.append(0)
            i += 2
        elif c == "$" and text[i : i + 1] in ("(", "{"):
            stack.append("$" + text[i])
            depth.append(0)
            i += 1
        elif c == "`":
            if top == "`":
                stack.pop()
            else:
                stack.append("`")
        elif top == '"':
            if c == '"':
                stack.pop()
        elif c in ('"', "'"):
            stack.append(c)
        elif top == "${" and c == "}":
            stack.pop()
            depth.pop()
        elif top in ("$(", "$((") and c in ("(", ")"):
            if c == "(":
                depth[-1] += 1
            elif depth[-1]:
                depth[-1] -= 1
            else:
                if top == "$((":
                    i += 1  # its second )
                stack.pop()
                depth.pop()
        elif c == "<" and text.startswith("<", i):
            stack.append("<<")
    return found


def _context(stack: list[str]) -> str:
    for refused in _REFUSED:
        if refused in stack:
            return refused
    return stack[-1] if stack else ""
