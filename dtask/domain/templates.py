"""Templates: typed parameters, a skeleton with ``${name}`` placeholders, a split, a child.

Pure: no Celery, no SQL. ``Template.delay``/``submit``/``schedule`` reach the client through
a port (``Launcher``) that the ``dtask`` package installs, so this module imports nothing
above the domain.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from dtask.domain.bulk import Submitted
from dtask.domain.clients import Tier, tier_of
from dtask.domain.concurrency import Concurrency, check_concurrency
from dtask.domain.deadlines import OnLate, check_delay_tolerance, on_late_of
from dtask.domain.limits import MAX_ATTEMPTS, check_seconds, check_whole
from dtask.domain.params import Param, as_param
from dtask.domain.placeholders import placeholders, render
from dtask.domain.results import Reduce
from dtask.domain.schedules import CATCH_UP_WINDOW, GRACE, When
from dtask.domain.splitting import (
    RangeSplit,
    SpecText,
    SplitStrategy,
    check_count,
    check_specs,
)
from dtask.exceptions import (
    ConfigurationError,
    DtaskError,
    InvalidExecutionCap,
    InvalidVariables,
    Permanent,
    SplitFailed,
    TemplateDefinitionError,
    UnknownTemplate,
)

if TYPE_CHECKING:
    from datetime import datetime

    from dtask.domain.context import ChildContext
    from dtask.domain.runs import RunHandle
    from dtask.domain.schedules import Schedule

JSON = Any
ChildFunction = Callable[..., Any]  # may return a small JSON value: the child's result

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,99}$")


def check_execution_cap(value: object, where: str) -> float | None:
    """Seconds an attempt may run (None: no cap); raise InvalidExecutionCap naming ``where``."""
    if value is None:
        return None
    return check_seconds(f"{where}: execution cap", value, InvalidExecutionCap)


class RunOptions(TypedDict, total=False):
    """What one submit may set beyond the variables (``dtask.submit`` documents each)."""

    execution_cap: float | None  # seconds an attempt may run; overrides the template's
    client: str  # whom the run is charged to (default "default")
    priority: int | None  # 0 to 9, default 5, capped by the client's max_priority
    delay_tolerance: float | None  # seconds it may wait to start; overrides the template's
    on_late: OnLate | str | None  # "run" or "fail" when it did not start in time
    tier: Tier | str | None  # resource tier; overrides the template's (capped by the client's)
    notify_url: str | None  # POSTed the run's JSON when it finishes (signed, retried)
    countdown: float | None  # seconds from now before it may start (apply_async's)
    eta: datetime | None  # when it may start (naive: UTC); not with countdown
    queue: str | None  # its children's queue; overrides the template's
    after: Iterable[int | str | RunHandle] | None  # runs (ids, trigger keys) it waits for
    concurrency_key: str | None  # "${customer}": runs of one key beyond max_concurrent wait
    max_concurrent: int | None  # unfinished runs per concurrency key (default 1)


@dataclass(frozen=True)
class TemplateOptions:
    max_attempts: int = 3
    queue: str | None = None
    checkpoint_interval: float | None = None
    checkpoint_every: int | None = None
    execution_cap: float | None = None  # seconds an attempt may run; a run may override it
    delay_tolerance: float | None = None  # seconds a run may wait to start; a run may override
    on_late: OnLate = OnLate.RUN
    tier: Tier | None = None  # None: the client's tier (basic without one)
    stealable: bool = True  # a range child may give its rest's second half away (elastic.md)
    retry_on: tuple[type[BaseException], ...] | None = None  # None: every exception retries
    dont_retry_on: tuple[type[BaseException], ...] = ()
    concurrency: Concurrency | None = None  # at most so many unfinished runs per key

    def retries(self, exc: BaseException) -> bool:
        """Whether a child's failed attempt with ``exc`` is tried again (attempts left): never
        for ``Permanent``; dtask's own errors (a cap exceeded, a command's exit code) always;
        the user's unless ``dont_retry_on`` names them or ``retry_on`` does not."""
        if isinstance(exc, Permanent):
            return False
        if isinstance(exc, DtaskError):
            return True
        if isinstance(exc, self.dont_retry_on):
            return False
        return self.retry_on is None or isinstance(exc, self.retry_on)


@dataclass(frozen=True)
class Template:
    """A named skeleton of work: parameters, placeholders, a split and a child function."""

    name: str
    params: Mapping[str, Param]
    skeleton: JSON
    split: SplitStrategy
    function: ChildFunction
    options: TemplateOptions = field(default_factory=TemplateOptions)
    reduce: Reduce | None = None  # the children's results (index order) -> the run's result

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise TemplateDefinitionError(
                f"template name {self.name!r} must be 1-100 letters, digits or _ . : -"
            )
        unknown = placeholders(self.skeleton) - set(self.params)
        if unknown:
            raise TemplateDefinitionError(
                f"template {self.name!r}: placeholders {sorted(unknown)} are not parameters"
            )
        where = f"template {self.name!r}"
        check_whole(
            f"{where}: max_attempts", self.options.max_attempts, 1, MAX_ATTEMPTS,
            TemplateDefinitionError,
        )  # fmt: skip
        check_execution_cap(self.options.execution_cap, where)
        check_delay_tolerance(self.options.delay_tolerance, where)
        if self.options.checkpoint_interval is not None:
            check_seconds(
                f"{where}: checkpoint_interval", self.options.checkpoint_interval,
                TemplateDefinitionError, zero=True, high=86400,
            )  # fmt: skip
        if self.options.checkpoint_every is not None:
            check_whole(
                f"{where}: checkpoint_every", self.options.checkpoint_every, 1, 2**31 - 1,
                TemplateDefinitionError,
            )  # fmt: skip
        on_late_of(self.options.on_late, f"template {self.name!r}")
        try:
            json.dumps(self.skeleton)
        except (TypeError, ValueError) as exc:
            raise TemplateDefinitionError(
                f"template {self.name!r}: skeleton is not JSON: {exc}"
            ) from None

    @functools.cached_property
    def is_async(self) -> bool:
        """Its child function is ``async def`` (dtask/worker/coroutines.py runs it); asked
        for each child, so asked of ``inspect`` once."""
        return inspect.iscoroutinefunction(self.function)

    def validate(self, variables: Mapping[str, Any]) -> dict[str, Any]:
        """Checked variables with defaults filled in; raise InvalidVariables naming the problem."""
        extra = sorted(set(variables) - set(self.params))
        missing = sorted(n for n, p in self.params.items() if p.required and n not in variables)
        fields = {n: f"not a parameter of template {self.name!r}" for n in extra}
        fields.update({n: "required" for n in missing})
        checked: dict[str, Any] = {}
        for name, param in self.params.items():
            try:
                checked[name] = (
                    param.check(name, variables[name]) if name in variables else (param.default)
                )
            except InvalidVariables as exc:
                fields[name] = str(exc)
        if extra:
            raise InvalidVariables(
                f"template {self.name!r} has no parameter {', '.join(map(repr, extra))}"
                f" (parameters: {self._describe_params()})",
                fields,
            )
        if missing:
            raise InvalidVariables(
                f"template {self.name!r} needs {', '.join(map(repr, missing))}"
                f" (parameters: {self._describe_params()})",
                fields,
            )
        if fields:
            raise InvalidVariables(next(iter(fields.values())), fields)
        return checked

    def parse_variables(self, texts: Mapping[str, str]) -> dict[str, Any]:
        """Command-line ``NAME=VALUE`` texts -> typed values (unknown names left to validate)."""
        return {
            name: self.params[name].parse(name, text) if name in self.params else text
            for name, text in texts.items()
        }

    def render(self, variables: Mapping[str, Any]) -> JSON:
        return render(self.skeleton, variables)

    def plan(
        self,
        variables: Mapping[str, Any],
        max_children: int,
        max_spec: int = 65_536,
        slots: Callable[[], int] | None = None,
    ) -> list[SpecText]:
        """Validate, render and split: the child specs this trigger would run, as JSON text (a
        generator split runs as it is consumed: its errors are the split's too). A split by
        live capacity (``RangeSplit(parts="slots")``) asks ``slots`` how many it has (none
        given: one)."""
        rendered = self.precheck(variables, max_children)
        split = self.split
        if isinstance(split, RangeSplit) and split.per_slot is not None:
            split = split.for_slots(slots() if slots else 1, max_children)
        produce = getattr(split, "iterate", split)  # RangeSplit: one at a time
        with self._user_code("split"):
            return check_specs(produce(rendered), max_children, max_spec)

    def range_keys(self) -> tuple[str, str] | None:
        """The spec keys of a child's range ``[a, b]`` where its running children may give
        work away (a ``RangeSplit``, not ``stealable=False``); None otherwise."""
        if isinstance(self.split, RangeSplit) and self.options.stealable:
            return self.split.a, self.split.b
        return None

    def precheck(self, variables: Mapping[str, Any], max_children: int) -> JSON:
        """Validate and render; reject an oversized split early where the strategy can count."""
        return self.count(variables, max_children)[0]

    def count(self, variables: Mapping[str, Any], max_children: int) -> tuple[JSON, int | None]:
        """Validate and render; how many children the split will make, if it can count them
        without splitting (None otherwise); an oversized split is refused."""
        with self._user_code("rendering"):
            rendered = self.render(self.validate(variables))
        count = getattr(self.split, "count", None)
        if count is None:
            return rendered, None
        with self._user_code("split"):
            total = count(rendered)
        if total is not None:
            check_count(total, max_children)
        return rendered, total

    @contextmanager
    def _user_code(self, what: str) -> Iterator[None]:
        """Whatever the template's own code raises fails this trigger only, as a DtaskError."""
        try:
            yield
        except DtaskError:
            raise
        except Exception as exc:
            raise SplitFailed(
                f"the {what} of template {self.name!r} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _describe_params(self) -> str:
        return ", ".join(f"{n}: {p.type_name}" for n, p in self.params.items()) or "none"

    def submit(
        self,
        variables: Mapping[str, Any] | None = None,
        key: str | None = None,
        **options: Unpack[RunOptions],
    ) -> RunHandle:
        """Trigger one run with ``options`` (see ``RunOptions`` and ``dtask.submit``)."""
        return launcher().submit(self.name, dict(variables or {}), key=key, **options)

    def map(
        self,
        items: Iterable[Mapping[str, Any]],
        keys: Sequence[str | None] | None = None,
        **options: Unpack[RunOptions],
    ) -> list[Submitted]:
        """A run for each of ``items`` (each its variables), in chunks of one transaction
        each: ``dtask.submit_many``. Each item's outcome, in input order."""
        return launcher().submit_many(self.name, items, keys=keys, **options)

    def delay(self, **variables: Any) -> RunHandle:
        """Trigger one master run, the Celery way: ``template.delay(n=10)``;
        ``template.delay(n=10, after=[run])`` waits for ``run`` to succeed (unless the
        template has a parameter named ``after``: then use ``submit``)."""
        if "after" in variables and "after" not in self.params:
            after = variables.pop("after")
            return self.submit(variables, after=after)
        return self.submit(variables)

    async def adelay(self, **variables: Any) -> RunHandle:
        """``delay`` for asyncio code (an ASGI app): ``await template.adelay(n=10)``, without
        blocking the event loop (``dtask.asubmit``)."""
        options: RunOptions = {}
        if "after" in variables and "after" not in self.params:
            options["after"] = variables.pop("after")
        return await launcher().asubmit(self.name, variables, key=None, **options)

    def apply_async(
        self,
        args: tuple[Any, ...] | list[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        **options: Unpack[RunOptions],
    ) -> RunHandle:
        """``delay`` with options, as Celery's: ``template.apply_async(kwargs={"n": 10},
        countdown=60, priority=8, queue="gpu", key="nightly")``. A template's variables are
        named: positional ``args`` are refused."""
        if args:
            raise InvalidVariables(
                f"template {self.name!r} takes named variables: apply_async(kwargs={{...}}),"
                f" not args {tuple(args)!r}"
            )
        return self.submit(kwargs, key=key, **options)

    def delay_on_commit(self, **variables: Any) -> None:
        """``delay`` once the caller's database transaction commits, as Celery's
        ``delay_on_commit`` (Django's ``transaction.on_commit``): a rollback triggers nothing;
        outside a transaction, or where Django is not set up, it triggers at once. Returns
        None, as Celery's does (the run does not exist yet); to have the run in the caller's
        transaction, see ``dtask.submit(..., using=...)``."""
        launcher().on_commit(lambda: self.delay(**variables))

    def apply_async_on_commit(
        self,
        args: tuple[Any, ...] | list[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        key: str | None = None,
        **options: Unpack[RunOptions],
    ) -> None:
        """``apply_async`` once the caller's transaction commits (see ``delay_on_commit``)."""
        if args:  # refused now, not after the commit
            self.apply_async(args, kwargs, key=key, **options)
        launcher().on_commit(lambda: self.apply_async(kwargs=kwargs, key=key, **options))

    def s(self, *, key: str | None = None, **variables: Any) -> Any:
        """A Celery signature that submits a run when it is called (in a chain, a chord, a
        ``beat_schedule`` entry through ``add_periodic_task``): the task ``dtask.submit``,
        returning the run's id. In a chain the previous task's result, if a dict, adds
        variables (those given here win)."""
        return launcher().signature(self.name, variables, key=key, immutable=False)

    def si(self, *, key: str | None = None, **variables: Any) -> Any:
        """``s`` that ignores the previous task's result (an immutable signature)."""
        return launcher().signature(self.name, variables, key=key, immutable=True)

    def schedule(
        self,
        cron: str | None = None,
        *,
        name: str,
        every: int | None = None,
        tz: str = "UTC",
        misfire: str = "skip",
        overlap: str = "allow",
        grace: float = GRACE,
        catch_up_window: float = CATCH_UP_WINDOW,
        start: datetime | None = None,
        end: datetime | None = None,
        after_schedule: str | None = None,
        variables: Mapping[str, Any] | None = None,
        **more_variables: Any,
    ) -> Schedule:
        """Save (or update) the schedule ``name`` that triggers this template, e.g.
        ``print_range.schedule("*/5 * * * *", name="nightly", n=100)``. Calling it again with
        the same arguments changes nothing, so it can run at every start of an application.
        Variables named like an option go in ``variables={...}`` (the options are spelled out
        here, not taken as ``**When`` as ``dtask.add_schedule`` does, because the keyword
        arguments are the variables)."""
        when = When(
            cron=cron,
            every=every,
            tz=tz,
            misfire=misfire,
            overlap=overlap,
            grace=grace,
            catch_up_window=catch_up_window,
            start=start,
            end=end,
        )
        variables = {**(variables or {}), **more_variables}
        return launcher().schedule(
            name, self.name, variables, replace=True, after_schedule=after_schedule, **when
        )

    def __call__(self, ctx: ChildContext, **spec: Any) -> None:
        self.function(ctx, **spec)


class Launcher(Protocol):
    """What a template needs from the layer that triggers runs (installed by ``dtask``)."""

    def submit(
        self,
        template: str,
        variables: dict[str, Any],
        *,
        key: str | None,
        **options: Unpack[RunOptions],
    ) -> RunHandle: ...

    async def asubmit(
        self,
        template: str,
        variables: dict[str, Any],
        *,
        key: str | None,
        **options: Unpack[RunOptions],
    ) -> RunHandle: ...

    def submit_many(
        self,
        template: str,
        items: Iterable[Mapping[str, Any]],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[RunOptions],
    ) -> list[Submitted]: ...

    def schedule(
        self,
        name: str,
        template: str,
        variables: dict[str, Any],
        *,
        replace: bool,
        after_schedule: str | None = None,
        **when: Unpack[When],
    ) -> Schedule: ...

    def signature(
        self, template: str, variables: dict[str, Any], *, key: str | None, immutable: bool
    ) -> Any: ...

    def on_commit(self, callback: Callable[[], Any]) -> None:
        """``callback()`` once the caller's transaction commits (never on a rollback), at once
        outside a transaction."""
        ...


_launcher: Launcher | None = None


def use_launcher(implementation: Launcher) -> None:
    global _launcher
    _launcher = implementation


def launcher() -> Launcher:
    if _launcher is None:
        raise ConfigurationError("no dtask client is installed: `import dtask` installs it")
    return _launcher


class Registry:
    """Templates by name. Re-registering the same function (a module reload) replaces it."""

    def __init__(self) -> None:
        self._templates: dict[str, Template] = {}

    def add(self, template: Template) -> Template:
        existing = self._templates.get(template.name)
        if existing is not None and _origin(existing.function) != _origin(template.function):
            raise TemplateDefinitionError(
                f"template {template.name!r} is defined twice:"
                f" {_origin(existing.function)} and {_origin(template.function)}"
            )
        self._templates[template.name] = template
        return template

    def get(self, name: str) -> Template:
        try:
            return self._templates[name]
        except KeyError:
            known = ", ".join(sorted(self._templates)) or "none"
            raise UnknownTemplate(
                f"unknown template {name!r} (known: {known}; load yours with DTASK_TEMPLATES)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._templates

    def discard(self, name: str) -> None:
        """Forget a template (one a test loaded from a file)."""
        self._templates.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._templates)

    def all(self) -> list[Template]:
        return [self._templates[n] for n in self.names()]


def _origin(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


registry = Registry()


def _exceptions(given: Any, option: str, name: str) -> tuple[type[BaseException], ...]:
    """An exception class or a tuple of them; a definition error otherwise."""
    found = given if isinstance(given, tuple) else (given,)
    if not all(isinstance(e, type) and issubclass(e, BaseException) for e in found):
        raise TemplateDefinitionError(
            f"template {name!r}: {option} takes an exception class or a tuple of them,"
            f" got {given!r:.80}"
        )
    return found


def _tier(tier: Tier | str | None, name: str) -> Tier | None:
    try:
        return tier_of(tier) if isinstance(tier, str) else tier
    except DtaskError as exc:
        raise TemplateDefinitionError(f"template {name!r}: {exc}") from None


def template(
    name: str,
    *,
    params: Mapping[str, type | Param] | None = None,
    skeleton: JSON = None,
    split: SplitStrategy,
    max_attempts: int = 3,
    queue: str | None = None,
    checkpoint_interval: float | None = None,
    checkpoint_every: int | None = None,
    execution_cap: float | None = None,
    delay_tolerance: float | None = None,
    on_late: OnLate | str = OnLate.RUN,
    tier: Tier | str | None = None,
    reduce: Reduce | None = None,
    stealable: bool = True,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    dont_retry_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    concurrency_key: str | None = None,
    max_concurrent: int | None = None,
) -> Callable[[ChildFunction], Template]:
    """Register the decorated child function as a template (see README). ``reduce``, if
    given, receives the list of the children's return values in index order when the run
    succeeds; what it returns (JSON) is the run's result. ``stealable=False``: a running
    child of a ``RangeSplit`` never gives work away to a new child (docs/elastic.md).
    ``concurrency_key`` (placeholders of the parameters, such as ``"${customer}"``): at most
    ``max_concurrent`` (default 1) unfinished runs of a client share a key; the others wait
    and start in submit order (docs/concurrency.md)."""

    def register(fn: ChildFunction) -> Template:
        return registry.add(
            Template(
                name=name,
                params={n: as_param(n, p) for n, p in (params or {}).items()},
                skeleton=skeleton if skeleton is not None else {},
                split=split,
                function=fn,
                options=TemplateOptions(
                    max_attempts=max_attempts,
                    queue=queue,
                    checkpoint_interval=checkpoint_interval,
                    checkpoint_every=checkpoint_every,
                    execution_cap=execution_cap,
                    delay_tolerance=delay_tolerance,
                    on_late=on_late_of(on_late, f"template {name!r}"),
                    tier=_tier(tier, name),
                    stealable=bool(stealable),
                    retry_on=None if retry_on is None else _exceptions(retry_on, "retry_on", name),
                    dont_retry_on=_exceptions(dont_retry_on, "dont_retry_on", name),
                    concurrency=check_concurrency(
                        concurrency_key,
                        max_concurrent,
                        f"template {name!r}",
                        set(params or {}),
                        TemplateDefinitionError,
                    ),
                ),
                reduce=reduce,
            )
        )

    return register
