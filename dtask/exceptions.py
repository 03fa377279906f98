"""One exception hierarchy. Every message is a single line a user can act on."""

from __future__ import annotations


class DtaskError(Exception):
    """Something went wrong in dtask."""

    exit_code = 2

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or type(self).__name__).strip())


class NotFound(DtaskError):
    """What was named does not exist (HTTP 404)."""


class Conflict(DtaskError):
    """The request contradicts what is there: a key's run, a run's state (HTTP 409)."""


class Invalid(DtaskError):
    """The caller's input cannot be used: fix it and send it again (HTTP 422)."""


class TemplateDefinitionError(DtaskError):
    """A template is defined wrongly (a programming error in the template's module)."""


class UnknownTemplate(NotFound):
    """No template is registered under that name."""


class InvalidVariables(Invalid):
    """The variables do not match the template's parameters."""

    def __init__(self, message: str | None = None, fields: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}  # each variable at fault, with what is wrong with it


class InvalidSplit(Invalid):
    """The split strategy produced child specs that cannot be run."""


class TooManyChildren(InvalidSplit):
    """The split would create more children than allowed (DTASK_MAX_CHILDREN)."""


class SplitFailed(InvalidSplit):
    """The template's own code (its split or rendering) raised an exception."""


class InvalidSchedule(Invalid):
    """The schedule's definition is invalid (cron, interval, time zone or policy)."""


class ScheduleNotFound(NotFound):
    """No schedule has that name."""


class ScheduleExists(Conflict):
    """A schedule with that name exists already."""


class InvalidExecutionCap(Invalid):
    """An execution cap must be a number of seconds greater than 0."""


class InvalidDelayTolerance(Invalid):
    """A delay tolerance must be a number of seconds greater than 0, on_late run or fail."""


class ExecutionCapExceeded(DtaskError):
    """A child's attempt ran longer than its execution cap and was stopped."""


class InvalidClient(Invalid):
    """A client's name or one of its settings is invalid."""


class ClientNotFound(NotFound):
    """No client has that name."""


class RateLimited(DtaskError):
    """limit exceeded: the client's rate limit refuses this submit for now."""

    exit_code = 4

    def __init__(self, message: str | None = None, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds; inf: this submit can never fit


class InvalidNotifyUrl(Invalid):
    """The completion notification's URL cannot be used."""


class TokenNotFound(NotFound):
    """No API token with that id."""


class KeyConflict(Conflict):
    """The trigger key is already used by a run with another template or variables."""


class RunNotFound(NotFound):
    """No run has that id."""


class ChildNotFound(NotFound):
    """The run has no child of that index."""


class ServiceUnavailable(DtaskError):
    """A service dtask needs cannot be reached."""


class DatabaseUnavailable(ServiceUnavailable):
    """PostgreSQL cannot be reached."""


class BrokerUnavailable(ServiceUnavailable):
    """The Celery broker cannot be reached."""


class StackDown(ServiceUnavailable):
    """The local stack's embedded services are stopped, and this command only reads."""


class Busy(ServiceUnavailable):
    """busy: the queue's (or the client's) backlog is at its cap; nothing was created."""

    exit_code = 4

    def __init__(self, message: str | None = None, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds


class ConfigurationError(DtaskError):
    """A DTASK_* setting is invalid."""


class SchemaMismatch(ConfigurationError):
    """The database's dtask schema is not the one this dtask needs (run `dtask migrate`)."""


class MissingExtra(ConfigurationError):
    """A feature needs an optional part of dtask that is not installed (`pip install dtask[x]`)."""


class Permanent(DtaskError):
    """A child's error that no retry can mend: raised by a child function (or one of its
    template's ``dont_retry_on``), its attempt fails for good at once."""


class InvalidResult(Permanent):
    """A child's return value or a run's reduced result cannot be kept (not JSON, too big),
    or the template's reduce raised."""


class InvalidStart(Invalid):
    """A countdown, eta or queue given to ``apply_async`` cannot be used."""


class RunFailed(DtaskError):
    """``Run.get()`` of a run that failed: its error (AsyncResult.get raises the task's)."""

    exit_code = 1


class RunCancelled(RunFailed):
    """``Run.get()`` of a cancelled (revoked) run."""


class WaitTimeout(DtaskError):
    """The run did not finish within the timeout."""

    exit_code = 3


class ChildStopped(DtaskError):
    """The child was asked to stop (its run was cancelled) and has committed its checkpoint."""


class NothingToRerun(Conflict):
    """The run succeeded: there is nothing to run again."""


class StackRunning(Conflict):
    """A `dtask up` already runs in this DTASK_HOME."""


class NotCancellable(Conflict):
    """The run has already finished."""


class LeaseLost(DtaskError):
    """This worker no longer owns the child: another owner took it over (fence moved)."""


class ChildFailed(DtaskError):
    """A child task failed for good (no attempts left)."""


class CommandFailed(DtaskError):
    """A command template's command exited with a code other than 0 (or was killed): a failed
    attempt, whose error holds the code and the end of its stderr."""


class UpstreamNotFound(RunNotFound):
    """A run named in ``after`` (by id or trigger key) does not exist."""


class UpstreamFailed(Conflict):
    """A rerun of a run whose upstream failed or was cancelled: that upstream comes first."""


class InvalidCheckpoint(Invalid):
    """A checkpoint that cannot be kept: not JSON, or over DTASK_MAX_CHECKPOINT."""


class InvalidInput(Invalid):
    """A value PostgreSQL cannot hold (text with a NUL or undecodable bytes, a number out of
    range) reached a query past the checks at the edges."""


class InvalidConcurrency(Invalid):
    """A concurrency key or limit that cannot be used (docs/concurrency.md)."""
