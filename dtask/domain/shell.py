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

# where a placeholder may not stand: inside arithmetic, a ${...} expansion, backticks, $'...',
# a here-document's line or body (to the end of the line's text), right after a backslash
_REFUSED = {
    "$((": "inside $((...)): arithmetic evaluates its text again",
    "${": "inside a ${...} expansion: its quoting differs between shells",
    "`": "inside backticks, whose backslashes are undone before their text is parsed again"
    " (write $(...))",
    "$'": "inside $'...'",
    "<<": "after << (a here-document): its body is not expanded as a word",
    "\\": "right after a backslash, which would quote the value's opening quote",
}
# words after which no placeholder of the line may stand anywhere: bash evaluates a value
# as arithmetic there (an array index in it runs a command), or parses it again; a case
# pattern's ")" inside $(...) and a line continuation are not followed by the scan below
_LINE_REFUSED = {
    "((": "(( )) evaluates its text as arithmetic in bash",
    "[[": "[[ ]] evaluates -eq and the like as arithmetic in bash",
    "$[": "$[ ] is arithmetic in bash",
    "let": "let evaluates its arguments as arithmetic",
    "declare": "declare -i makes later assignments arithmetic in bash",
    "typeset": "typeset -i makes later assignments arithmetic in bash",
    "local": "local -i makes later assignments arithmetic in bash",
    "eval": "eval parses its arguments as shell again",
    "case": "a case inside $(...) is not followed by the check of the placeholders' quoting",
    "\\\n": "a line continuation (backslash-newline) is not followed by the check",
}
_WORDS = ("let", "declare", "typeset", "local", "eval")
_BREAKS = " \t\n;&|()<>"


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
    contexts, refused = _contexts(text)
    if refused is not None and found:
        raise TemplateDefinitionError(
            f"${{{found[0]}}} stands in a line where {_LINE_REFUSED[refused]}; write that part"
            " in a script file of its own, its values as arguments"
        )
    places = iter(zip(found, contexts, strict=True))
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


def _contexts(text: str) -> tuple[list[str], str | None]:
    """POSIX sh's quoting, as far as a placeholder's place needs: for each _MARK, the quote
    or expansion it stands in (innermost; a refused one wherever it is open); and the first
    construct of _LINE_REFUSED the line holds, if any."""
    stack: list[str] = []
    depth: list[int] = []  # open parentheses inside each "$(" (a subshell's)
    found: list[str] = []
    refused = "\\\n" if "\\\n" in text else None
    i = 0
    while i < len(text):
        c = text[i]
        top = stack[-1] if stack else ""
        word = top in ("", "$(") and (i == 0 or text[i - 1] in _BREAKS)
        i += 1
        if c == _MARK:
            found.append(_context(stack))
        elif top == "'":
            if c == "'":
                stack.pop()
        elif top in ("<<", "#"):
            if top == "#" and c == "\n":
                stack.pop()
        elif c == "\\":
            if text[i : i + 1] == _MARK:
                found.append("\\")
            i += 1  # the next character is quoted
        elif top == "$'":
            if c == "'":
                stack.pop()
        elif word and c == "#":
            stack.append("#")  # a comment, to the end of its line
        elif word and (hit := _refused_word(text, i - 1, top)) is not None:
            refused = refused or hit
        elif c == "$" and text.startswith("((", i):
            stack.append("$((")
            depth.append(0)
            i += 2
        elif c == "$" and text[i : i + 1] in ("(", "{", "'", "["):
            if text[i] == "[":
                refused = refused or "$["
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
        elif top in ("${", "$[") and c in ("}", "]"):
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
    return found, refused


def _refused_word(text: str, at: int, top: str) -> str | None:
    """The _LINE_REFUSED construct that starts a word at ``at``, if one does."""
    for mark in ("((", "[["):
        if text.startswith(mark, at):
            return mark
    for word in (*_WORDS, "case"):
        end = at + len(word)
        if text.startswith(word, at) and (end == len(text) or text[end] in _BREAKS):
            return None if word == "case" and top != "$(" else word
    return None


def _context(stack: list[str]) -> str:
    for refused in _REFUSED:
        if refused in stack:
            return refused
    return stack[-1] if stack else ""
