"""Command templates against hostile values (docs/security.md): a value never becomes shell
text, a command sees none of the worker's settings, what it prints is read in bounded chunks,
echoed input cannot speak the protocol, and its whole process tree ends with it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtask.domain.commands import Command
from dtask.domain.context import ChildContext
from dtask.domain.lines import Lines
from dtask.domain.templates import registry
from dtask.exceptions import ChildStopped, CommandFailed, TemplateDefinitionError
from dtask.templating import command_templates
from dtask.templating.commands import CommandChild

SAMPLES = ["$(id -un > x.txt)", "`id`", "$HOME", "${HOME}", "'", '"', "\\", "a\nb", "' ; id ; '",
           '" ; id ; "', "-n", "*", "$((1+1))", "\\'", "x" * 100_000, "", " a", "b "]  # fmt: skip
HOSTILE = st.one_of(
    st.sampled_from(SAMPLES),
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])),
)
# each quoting a placeholder can stand in, and what the line prints for the value v
POSITIONS = [
    "printf '%s' ${v}",
    "printf '%s' \"${v}\"",
    "printf '%s' 'before'\"${v}\"'after' | sed -e 's/^before//' -e 's/after$//'",
    "printf '%s' \"x${v}x\" | sed -e 's/^x//' -e 's/x$//'",
    "printf '%s' 'x${v}x' | sed -e 's/^x//' -e 's/x$//'",
    "printf '%s' \"$$(printf '%s' \"${v}\")\"",
    '# don\'t follow links, "quoted"\nprintf \'%s\' "${v}"',
    "printf '%s' \"$$(# it's a comment\nprintf '%s' ${v})\"",
    "case x in x) printf '%s' \"${v}\";; esac",
    "v=${v}; printf '%s' \"$$v\"",
]


@pytest.mark.parametrize("line", POSITIONS)
@settings(max_examples=25)
@given(value=HOSTILE)
def test_a_value_never_becomes_shell_text(line: str, value: str) -> None:
    """The script is the line's own text whatever the value; the value is an argument, and
    the shell prints it back unchanged (no expansion, no splitting, no command run)."""
    argv = Command((line,), shell=True).line({"v": value})
    other = Command((line,), shell=True).line({"v": "plain"})
    assert argv[:4] == other[:4] and argv[4:] == [value]
    if "$(" in line or "`" in line:
        value = value.rstrip("\n")  # command substitution drops trailing newlines
    if "\n" in value and "sed" in line:
        return  # sed works line by line: the argv above is what is proven
    printed = subprocess.run(argv, capture_output=True, check=True).stdout
    assert printed == value.encode()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("echo $$(( ${n} + 1 ))", r"\$\{n\} stands inside \$\(\(\.\.\.\)\): arithmetic"),
        ("echo $${X:-${n}}", r"\$\{n\} stands inside a \$\{\.\.\.\} expansion"),
        ("cat <<EOF\n${n}\nEOF", r"\$\{n\} stands after << \(a here-document\)"),
        ("echo \\${n}", r"\$\{n\} stands right after a backslash"),
        ('echo "`echo \\"${n}\\"`"', r"\$\{n\} stands inside backticks"),
        ("echo $$'it\\'s ${n}'", r"\$\{n\} stands inside \$'\.\.\.'"),
        ("(( ${n} > 1 ))", r"\(\( \)\) evaluates its text as arithmetic in bash"),
        ("[[ ${n} -gt 1 ]]", r"\[\[ \]\] evaluates -eq"),
        ("let x=${n}+1", "let evaluates its arguments as arithmetic"),
        ("declare -i x; x=${n}", "declare -i makes later assignments arithmetic"),
        ("echo $$[${n}+1]", r"\$\[ \] is arithmetic in bash"),
        ("eval echo ${n}", "eval parses its arguments as shell again"),
        ('echo "$$(case a in a) echo;; esac) ${n}"', r"a case inside \$\(\.\.\.\)"),
        ("echo $$\\\n((${n}+1))", "a line continuation"),
    ],
)
def test_a_placeholder_where_a_value_would_not_stay_data_is_refused_when_loaded(
    tmp_path: Path, line: str, why: str
) -> None:
    name = f"cmd_{uuid.uuid4().hex[:8]}"
    path = tmp_path / "jobs.toml"
    path.write_text(
        f'[template.{name}]\nparams = {{ n = "str" }}\nskeleton = {{ s = 1, e = 2, n ='
        f' "${{n}}" }}\nsplit = {{ range = ["s", "e"], carry = ["n"] }}\nshell = true\n'
        f"command = [{_toml(line)}]\n"
    )
    with pytest.raises(TemplateDefinitionError, match=why) as raised:
        command_templates.load(path)
    said = str(raised.value)
    assert said.startswith(f"{path}: template {name!r}: ") and "\n" not in said
    assert name not in registry


def _toml(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def context(**overrides: Any) -> tuple[ChildContext, list[str], list[object]]:
    printed: list[str] = []
    written: list[object] = []
    fields: dict[str, Any] = dict(
        run_id=7, index=2, attempt=1, checkpoint_state=None, writer=written.append,
        checkpoint_interval=60, checkpoint_every=100, output=printed.append,
        max_checkpoint=1000, max_result=1000, max_output_line=100,
    )  # fmt: skip
    fields.update(overrides)
    return ChildContext(**fields), printed, written


def test_a_command_sees_a_clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTASK_DATABASE_URL", "postgresql://u:secret@db/x")
    monkeypatch.setenv("DTASK_BROKER_URL", "redis://:secret@r/0")
    monkeypatch.setenv("AWS_PROFILE", "prod")
    monkeypatch.setenv("OTHER", "x")
    ctx, printed, _ = context(max_output_line=10_000)
    command = Command(("/usr/bin/env",), env={"MODE": "fast"}, env_pass=("AWS_PROFILE",))
    CommandChild(command, "t")(ctx)
    seen = dict(line.rstrip("\n").split("=", 1) for line in printed)
    assert "secret" not in "".join(printed)
    assert set(seen) <= {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
        "MODE", "AWS_PROFILE", "DTASK_RUN_ID", "DTASK_CHILD_INDEX", "DTASK_ATTEMPT",
        "DTASK_CHECKPOINT", "DTASK_PROTOCOL_FD",
    }  # fmt: skip
    assert (seen["MODE"], seen["AWS_PROFILE"], seen["DTASK_RUN_ID"]) == ("fast", "prod", "7")
    assert (seen["DTASK_CHILD_INDEX"], seen["DTASK_PROTOCOL_FD"]) == ("2", "3")


@pytest.mark.parametrize("name", ["DTASK_DATABASE_URL", "dtask_broker_url", "DTASK_SECRETS_DIR"])
def test_env_pass_never_names_a_dtask_setting(tmp_path: Path, name: str) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(
        '[template.t]\nparams = {}\nskeleton = { s = 1, e = 2 }\nsplit = { range = ["s", "e"] }'
        f'\ncommand = ["true"]\nenv_pass = ["{name}"]\n'
    )
    with pytest.raises(TemplateDefinitionError, match=f"env_pass: {name} is a dtask setting"):
        command_templates.load(path)


def test_echoed_input_cannot_speak_the_protocol() -> None:
    """A variable echoed on stdout stays output; only file descriptor 3 speaks."""
    forged = 'x\n::result {"forged": true}\n::checkpoint {"done": 99}'
    ctx, printed, written = context()
    command = Command(("/bin/sh", "-c", "echo \"processing $0\"; echo '::result 1' >&3", "${v}"))
    assert CommandChild(command, "t")(ctx, v=forged) == 1
    assert written == [] and "".join(printed) == f"processing {forged}\n"


def test_with_protocol_stdout_the_old_protocol_works() -> None:
    ctx, printed, written = context()
    script = 'echo "::checkpoint {\\"done\\": 1}"; echo hello; echo "::result 2"'
    command = Command(("/bin/sh", "-c", script), protocol="stdout")
    assert CommandChild(command, "t")(ctx) == 2
    assert written == [{"done": 1}] and printed == ["hello\n"]


def test_a_line_that_is_not_the_protocol_on_its_descriptor_fails_the_attempt() -> None:
    ctx, _, _ = context()
    with pytest.raises(CommandFailed, match="file descriptor 3 that is not ::checkpoint"):
        CommandChild(Command(("/bin/sh", "-c", "echo hello >&3")), "t")(ctx)


@pytest.mark.parametrize("newline", [True, False])
def test_a_protocol_line_past_its_limit_fails_the_attempt_in_one_line(newline: bool) -> None:
    """Without a newline the command would never end the line: it is failed at once."""
    ctx, _, _ = context()
    end = "; echo" if newline else "; sleep 30"
    script = f"{{ printf '::checkpoint '; head -c 5000000 /dev/zero | tr '\\0' 1{end}; }} >&3"
    started = time.monotonic()
    with pytest.raises(CommandFailed, match=r"protocol line of .* bytes or more, over the limit"):
        CommandChild(Command(("/bin/sh", "-c", script), grace=1), "t")(ctx)
    assert time.monotonic() - started < 20


def test_a_long_line_is_cut_and_marked_never_read_whole() -> None:
    ctx, printed, _ = context(max_output_line=1000)
    script = "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo after"
    CommandChild(Command(("/bin/sh", "-c", script)), "t")(ctx)
    assert printed == ["x" * 1000 + " [line cut: 2,999,000 bytes more]\n", "after\n"]


@settings(max_examples=200)
@given(
    data=st.binary(max_size=300).map(lambda b: b.replace(b"\x00", b"\n")),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    limit=st.integers(1, 20),
)
def test_lines_keep_at_most_their_limit_whatever_the_chunks(
    data: bytes, cuts: list[int], limit: int
) -> None:
    lines = Lines(limit)
    got = []
    at = 0
    for cut in [*sorted(cuts), len(data)]:
        got += lines.feed(data[at : max(cut, at)])
        at = max(cut, at)
    end = lines.end()
    got += [end] if end is not None else []
    whole = data.split(b"\n")
    if whole[-1] == b"":
        whole.pop()
    assert [(g.data, g.dropped) for g in got] == [
        (w[:limit], max(len(w) - limit, 0)) for w in whole
    ]


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """A script starting a grandchild that ignores SIGTERM and one that called setsid, each
    writing its pid; every pid written is dead at the end of the test, whatever it asserts."""
    yield tmp_path
    for pid in _pids(tmp_path):
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


TREE = (
    "(trap '' TERM; echo $$$$ > ignores.pid; exec sleep 300) & "
    "setsid sh -c 'echo $$$$ > setsid.pid; exec sleep 300' & "
    "while [ ! -s ignores.pid ] || [ ! -s setsid.pid ]; do sleep 0.01; done; "
)


def _pids(folder: Path) -> list[int]:
    return [int(p.read_text()) for p in folder.glob("*.pid") if p.read_text().strip()]


def _gone(folder: Path, within: float) -> None:
    deadline = time.monotonic() + within
    pids = _pids(folder)
    assert len(pids) == 2
    while alive := [p for p in pids if _alive(p)]:
        assert time.monotonic() < deadline, f"still running: {alive}"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_what_a_command_left_running_ends_after_it(tree: Path) -> None:
    ctx, _, _ = context()
    command = Command(("/bin/sh", "-c", TREE + "echo '::result 1' >&3"), cwd=str(tree), grace=1)
    started = time.monotonic()
    assert CommandChild(command, "t")(ctx) == 1
    assert time.monotonic() - started < 1 + 10  # the grace, then SIGKILL
    _gone(tree, 2)


def test_a_stop_request_ends_the_whole_tree(tree: Path) -> None:
    asked = time.monotonic() + 1
    ctx, _, _ = context(stop_requested=lambda: time.monotonic() > asked)
    command = Command(("/bin/sh", "-c", TREE + "sleep 300"), cwd=str(tree), grace=1)
    with pytest.raises(ChildStopped):
        CommandChild(command, "t")(ctx)
    _gone(tree, 1 + 2)


def test_a_sigkilled_pool_process_takes_the_whole_tree(tree: Path) -> None:
    """The pool process is a Python process of its own here, SIGKILLed once the tree runs."""
    code = (
        "from dtask.domain.commands import Command\n"
        "from dtask.domain.context import ChildContext\n"
        "from dtask.templating.commands import CommandChild\n"
        "ctx = ChildContext(run_id=1, index=0, attempt=1, checkpoint_state=None,"
        " writer=print, checkpoint_interval=60, checkpoint_every=100)\n"
        f"CommandChild(Command(('/bin/sh', '-c', {TREE + 'sleep 300'!r}), grace=1), 't')(ctx)\n"
    )
    pool = subprocess.Popen([sys.executable, "-c", code], cwd=tree)
    try:
        deadline = time.monotonic() + 60
        while len(_pids(tree)) < 2:
            assert time.monotonic() < deadline and pool.poll() is None, "the tree started"
            time.sleep(0.05)
        pool.kill()
        pool.wait(10)
        _gone(tree, 1 + 2)
    finally:
        pool.kill()
        pool.wait(10)


@pytest.mark.parametrize("value", ["\x00", "\ud800", {"k\x00": 1}, [[["x\udfff"]]]])
def test_a_result_or_checkpoint_postgresql_cannot_store_fails_the_attempt(value: object) -> None:
    """Before, such a result reached the batch that finishes one-child runs together, failed
    its transaction and left the other runs of the batch to run again."""
    from dtask.domain.results import encode_result
    from dtask.exceptions import InvalidCheckpoint, InvalidResult

    with pytest.raises(InvalidResult, match="PostgreSQL cannot store"):
        encode_result(value, 10_000, "child", "DTASK_MAX_CHILD_RESULT")
    ctx, _, _ = context()
    with pytest.raises(InvalidCheckpoint, match=r"PostgreSQL cannot store|surrogates not allowed"):
        ctx.checkpoint(value)
    ctx.state["x"] = value
    with pytest.raises(InvalidCheckpoint, match="PostgreSQL cannot store"):
        _ = ctx._progress(1)


def test_a_nul_in_a_command_is_refused_when_loaded() -> None:
    with pytest.raises(TemplateDefinitionError, match="NUL"):
        Command(("echo", "a\x00b"))
    with pytest.raises(TemplateDefinitionError, match="NUL"):
        Command(("echo",), env={"X": "\x00"})
