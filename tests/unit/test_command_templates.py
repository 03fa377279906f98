"""Command templates (docs/commands.md): argv from a child's spec without a shell, the lines a
command prints to dtask, and TOML files checked when loaded (one line naming file and key)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dtask.domain.commands import Command, exit_error, message
from dtask.domain.templates import registry
from dtask.exceptions import CommandFailed, TemplateDefinitionError
from dtask.templating import command_templates

HOSTILE = ["; rm -rf /", "$(touch /tmp/owned)", "`id`", "a b", "'\"", "--flag=x"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_variable_reaches_the_command_as_one_literal_argument(value: str) -> None:
    command = Command(("./bin/p", "--name", "${name}", "--at=${a}"))
    assert command.line({"name": value, "a": 7}) == ["./bin/p", "--name", value, "--at=7"]


@pytest.mark.parametrize("value", HOSTILE)
def test_with_shell_true_each_value_is_quoted(value: str) -> None:
    import subprocess

    line = Command(("printf '%s\\n' ${name} $$HOME-x",), shell=True).line({"name": value})
    assert line[:2] == ["/bin/sh", "-c"]
    printed = subprocess.run(line, capture_output=True, text=True, check=True).stdout
    assert printed.splitlines()[0] == value


def test_protocol_lines_and_errors() -> None:
    assert message('::checkpoint {"done": 3}\n') == ("checkpoint", {"done": 3})
    assert message("::result [1, 2]") == ("result", [1, 2])
    assert message("12\n") is None and message(":: checkpoint x") is None
    with pytest.raises(CommandFailed, match="::checkpoint line that is not JSON"):
        message("::checkpoint {oops")
    assert exit_error(3, ["a\n", "boom\n"]) == (
        "the command exited with code 3; its stderr ended with:\na\nboom"
    )
    assert exit_error(-9, []) == "the command killed by signal 9"


@pytest.fixture
def toml(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    name = f"cmd_{uuid.uuid4().hex[:8]}"
    yield tmp_path / "jobs.toml", name
    registry.discard(name)


GOOD = """
[template.{name}]
params = {{ n = "int", folder = {{ type = "str", default = "in" }} }}
skeleton = {{ start = 1, end = "${{n}}", folder = "${{folder}}" }}
split = {{ range = ["start", "end"], parts = 4, carry = ["folder"] }}
command = ["./bin/process", "--from", "${{a}}", "--to", "${{b}}", "--in", "${{folder}}"]
env = {{ MODE = "fast" }}
max_attempts = 2
execution_cap = 60
"""


def test_a_toml_template_loads_and_plans_like_a_python_one(toml: tuple[Path, str]) -> None:
    path, name = toml
    path.write_text(GOOD.format(name=name))
    (template,) = command_templates.load(path)
    assert registry.get(name) is template
    assert (template.options.max_attempts, template.options.execution_cap) == (2, 60)
    assert template.range_keys() is None  # a command is never cut
    specs = template.plan({"n": 8}, 100)
    assert specs[0] == '{"a":1,"b":2,"folder":"in"}' and len(specs) == 4
    command = template.function.command  # type: ignore[attr-defined]
    assert command.cwd == str(path.parent) and dict(command.env) == {"MODE": "fast"}
    assert command.line({"a": 1, "b": 2, "folder": "x y"})[-2:] == ["--in", "x y"]
    command_templates.load(path)  # loaded again (a reload): the same template, no error


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("max_attempts = 2", "max_attemps = 2"), r"unknown key 'max_attemps' \(known: "),
        (("max_attempts = 2", 'max_attempts = "2"'), "max_attempts must be int, got str '2'"),
        (('"${{a}}", "--to"', '"${{x}}", "--to"'), r"command: \$\{x\} names no key of a child"),
        (('end = "${{n}}"', 'end = "${{m}}"'), r"placeholders \['m'\] are not parameters"),
        (('n = "int"', 'n = "integer"'), "params.n: type 'integer' is not one of int"),
        (("parts = 4", 'parts = "cores"'), 'split: RangeSplit parts must be a number, "slots"'),
        (('range = ["start", "end"]', 'range = "start"'), "split.range must name the skeleton"),
        (('env = {{ MODE = "fast" }}', "env = {{ MODE = 1 }}"), "env.MODE must be a string"),
        (("command = [", "shell = true\ncommand = ["), "with shell = true, command is one line"),
        (("max_attempts = 2", 'tier = "gold"'), "tier 'gold' is not one of basic"),
    ],
)
def test_a_wrong_toml_template_is_one_line_naming_the_file_and_key(
    toml: tuple[Path, str], change: tuple[str, str], expected: str
) -> None:
    path, name = toml
    path.write_text(GOOD.replace(*change).format(name=name))
    with pytest.raises(TemplateDefinitionError, match=expected) as raised:
        command_templates.load(path)
    assert str(raised.value).startswith(f"{path}: ") and "\n" not in str(raised.value)
    assert name not in registry


def test_a_file_that_is_not_toml_or_has_no_template_is_named(tmp_path: Path) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text("[template.x\n")
    with pytest.raises(TemplateDefinitionError, match=f"^{path}: not TOML: "):
        command_templates.load(path)
    path.write_text("[jobs.x]\n")
    with pytest.raises(TemplateDefinitionError, match="unknown key 'jobs'"):
        command_templates.load(path)
    with pytest.raises(TemplateDefinitionError, match="cannot be read"):
        command_templates.load(tmp_path / "missing.toml")


def test_a_command_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    from dtask.domain.context import ChildContext
    from dtask.templating.commands import CommandChild

    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None, writer=lambda state: None,
        checkpoint_interval=60, checkpoint_every=100,
    )  # fmt: skip
    child = CommandChild(Command(("./missing", "${a}"), cwd=str(tmp_path)), "test")
    with pytest.raises(CommandFailed, match=r"^the command './missing' could not start in "):
        child(ctx, a=1)


@pytest.mark.parametrize("ignores_term", [False, True])
def test_a_stop_request_ends_the_command_sigterm_then_sigkill(
    tmp_path: Path, ignores_term: bool
) -> None:
    """A drain, a cancel or the execution cap (``ctx.should_stop()``): the command's session
    gets SIGTERM, then SIGKILL after the grace; its last checkpoint is committed again."""
    import time

    from dtask.domain.context import ChildContext
    from dtask.exceptions import ChildStopped
    from dtask.templating.commands import CommandChild

    asked = time.monotonic() + 0.5
    written: list[object] = []
    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state={"next": 5},
        writer=lambda state: written.append(state), checkpoint_interval=60,
        checkpoint_every=100, stop_requested=lambda: time.monotonic() > asked,
    )  # fmt: skip
    trap = "trap '' TERM; " if ignores_term else ""
    script = f"{trap}echo $$$$ > pid; sleep 30 & echo $! > child; wait"  # $$: a literal $
    child = CommandChild(Command(("/bin/sh", "-c", script), cwd=str(tmp_path), grace=0.5), "t")
    with pytest.raises(ChildStopped):
        child(ctx)
    assert written == [{"next": 5}]
    for name in ("pid", "child"):  # the shell and what it started: the whole session
        pid = int((tmp_path / name).read_text())
        # signalled already; a busy machine may run a SIGTERMed process's exit a little later
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"{name} {pid} still runs"
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie is dead
    except psutil.NoSuchProcess:
        return False


def test_a_stealable_command_reads_its_ranges_end_back_after_each_checkpoint(
    tmp_path: Path,
) -> None:
    """Asked at its second checkpoint, the child gives the second half of its rest away;
    the command reads the new end (15) and stops there; asked on no other checkpoint."""
    from dtask.domain.context import ChildContext, Stealable
    from dtask.templating.commands import CommandChild

    written: list[object] = []
    given: list[int] = []
    stealable = Stealable(1, 40, lambda at: given.append(at) is None)
    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None,
        writer=lambda state: written.append(state) or len(written) == 2,
        checkpoint_interval=60, checkpoint_every=100, stealable=stealable,
    )  # fmt: skip
    script = (
        'to=$1; i=$0; while [ "$i" -le "$to" ]; do echo "did $i"; i=$((i + 1));'
        ' if [ $((i % 5)) -eq 1 ]; then echo "::checkpoint {\\"done\\": $((i - 1))}" >&3;'
        ' read -r to; fi; done; echo "::result $to" >&3'
    )
    command = Command(("/bin/sh", "-c", script, "${a}", "${b}"), stealable=True)
    assert CommandChild(command, "t")(ctx, a=1, b=40) == 25
    assert given == [26]  # done 10 of 1..40: the rest is 11..40, its second half 26..40
    assert written == [{"done": 5}, {"done": 10}, {"done": 15}, {"done": 20}, {"done": 25}]
    assert (stealable.a, stealable.b) == (1, 25)


def test_a_stealable_command_that_never_reads_its_stdin_runs_to_its_end() -> None:
    """The replies go to a pipe nobody reads: once it is full they are dropped, and the
    command's checkpoints still commit."""
    from dtask.domain.context import ChildContext, Stealable
    from dtask.templating.commands import CommandChild

    written: list[object] = []
    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None,
        writer=lambda state: written.append(state), checkpoint_interval=60,
        checkpoint_every=100, stealable=Stealable(1, 10**12, lambda at: False),
    )  # fmt: skip
    script = (
        'i=0; while [ "$i" -lt 20000 ]; do echo "::checkpoint {\\"done\\": $i}" >&3;'
        " i=$((i + 1)); done"
    )
    CommandChild(Command(("/bin/sh", "-c", script), stealable=True), "t")(ctx)
    assert len(written) == 20000  # 20,000 replies of 14 bytes: four times a pipe's 64 KiB
