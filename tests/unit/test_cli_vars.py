"""A run's variables on the command line: ``-e``/``--var NAME=VALUE``; the retired ``-v`` is
still taken, with a one-line note (issue 42: ``-v`` is verbose or version elsewhere)."""

from __future__ import annotations

import re

import pytest

from dtask.cli import base, parser


def test_e_and_var_are_collected_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    args = parser().parse_args(["submit", "squares", "-e", "n=1", "--var", "m=2"])
    assert args.var == ["n=1", "m=2"]
    args = parser().parse_args(["schedule", "add", "s", "squares", "-e", "n=1", "--every", "5"])
    assert args.var == ["n=1"]
    assert capsys.readouterr().err == ""


def test_the_old_v_still_works_and_says_once_what_replaced_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base._OldVar, "said", False)
    args = parser().parse_args(["submit", "squares", "-v", "n=1", "-e", "m=2", "-v", "k=3"])
    assert args.var == ["n=1", "m=2", "k=3"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-v NAME=VALUE is now -e NAME=VALUE (or --var)" in err


def test_help_names_e_and_not_v(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["submit", "--help"])
    shown = capsys.readouterr().out
    assert "-e NAME=VALUE, --var NAME=VALUE" in shown
    assert not re.search(r"(^|[\s\[,])-v\b", shown), shown
