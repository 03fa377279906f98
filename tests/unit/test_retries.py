"""Which failed attempts are tried again: ``dtask.Permanent``, a template's ``retry_on`` and
``dont_retry_on``, dtask's own errors (issue 42)."""

from __future__ import annotations

import pytest

import dtask
from dtask.domain.templates import TemplateOptions
from dtask.exceptions import (
    CommandFailed,
    ExecutionCapExceeded,
    InvalidResult,
    TemplateDefinitionError,
)


@pytest.mark.parametrize(
    ("options", "exc", "retried"),
    [
        (TemplateOptions(), ValueError("x"), True),
        (TemplateOptions(), dtask.Permanent("x"), False),
        (TemplateOptions(), InvalidResult("not JSON"), False),
        (TemplateOptions(dont_retry_on=(KeyError,)), KeyError("x"), False),
        (TemplateOptions(dont_retry_on=(LookupError,)), IndexError("x"), False),
        (TemplateOptions(dont_retry_on=(KeyError,)), ValueError("x"), True),
        (TemplateOptions(retry_on=(OSError,)), ConnectionError("x"), True),
        (TemplateOptions(retry_on=(OSError,)), ValueError("x"), False),
        (
            TemplateOptions(retry_on=(OSError,), dont_retry_on=(TimeoutError,)),
            TimeoutError(),
            False,
        ),
        (TemplateOptions(retry_on=(OSError,)), ExecutionCapExceeded("cap"), True),
        (TemplateOptions(retry_on=()), CommandFailed("exit 3"), True),
        (TemplateOptions(retry_on=()), dtask.Permanent("x"), False),
    ],
)
def test_which_errors_are_retried(options: TemplateOptions, exc: Exception, retried: bool) -> None:
    assert options.retries(exc) is retried


def test_retry_options_take_an_exception_class_or_a_tuple_of_them() -> None:
    def child(ctx: dtask.ChildContext) -> None:
        pass

    split = lambda r: [{}]  # noqa: E731
    made = dtask.template("retries_ok", split=split, retry_on=OSError, dont_retry_on=(KeyError,))
    options = made(child).options
    assert (options.retry_on, options.dont_retry_on) == ((OSError,), (KeyError,))
    dtask.registry.discard("retries_ok")
    for bad in ("ValueError", (KeyError, 3), ValueError("x")):
        with pytest.raises(TemplateDefinitionError, match="dont_retry_on takes an exception class"):
            dtask.template("retries_bad", split=split, dont_retry_on=bad)(child)  # type: ignore[arg-type]
