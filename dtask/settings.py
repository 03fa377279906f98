"""DTASK_* environment -> frozen, validated settings. The one place that reads dtask's environment.

Empty variables count as unset. A DTASK_* name that is nearly a setting's name (DTASK_LEASE_TT)
is an error; any other DTASK_* name is left alone, for templates' own use (DTASK_TEST_SINK).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import platformdirs
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from dtask import settings_source
from dtask.domain import urls
from dtask.domain.notify import check_url
from dtask.exceptions import ConfigurationError, InvalidNotifyUrl

PREFIX = "DTASK_"


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://", "redis+socket://", "sentinel://"))


def is_sentinel(url: str | None) -> bool:
    """Celery's Redis Sentinel form: ``sentinel://h1:26379;sentinel://h2:26379;...``."""
    return url is not None and url.startswith("sentinel://")


def _urls(url: str) -> list[str]:
    """The URLs of a Sentinel URL (one per sentinel), or the URL itself."""
    return re.split(r";(?=sentinel://)", url) if is_sentinel(url) else [url]


_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


# Upper bounds of settings (docs/security.md): a duration past them is a typo, and each one
# is added to now() somewhere (a lease's expiry, an alert's horizon), which must stay a moment
# PostgreSQL and psycopg both read; sizes stay below what one JSONB value holds (255 MB).
_HOUR, _DAY, _YEAR = 3600.0, 86400.0, 366 * 86400.0
_MAX_JSON = 64 * 1024 * 1024


def _default_backend(data: dict[str, Any]) -> str | None:
    broker = data.get("broker_url")
    return broker if broker is not None and is_redis(broker) else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_ignore_empty=True, frozen=True, allow_inf_nan=False
    )

    # one local stack per user, whatever folder a command runs in (~/.local/state/dtask)
    home: Path = Field(
        default_factory=lambda: platformdirs.user_state_path("dtask"),
        json_schema_extra={"shown": "user state dir"},
        description=(
            "where the embedded PostgreSQL and Redis keep their data: one stack per user, shared "
            "by commands run from any folder (`~/.local/state/dtask` on Linux)"
        ),
    )
    database_url: str | None = Field(
        None,
        json_schema_extra={"shown": "embedded"},
        description=(
            "PostgreSQL URL (`postgresql+psycopg://user:pw@host/db`); unset = embedded PostgreSQL"
        ),
    )
    auto_migrate: bool = Field(
        False,
        description=(
            "`1`: a process brings a shared database's schema up to date when it starts (the "
            "embedded one always is); `0`: it refuses an old schema with one line saying to run "
            "`dtask migrate`"
        ),
    )
    broker_url: str | None = Field(
        None,
        json_schema_extra={"shown": "embedded"},
        description=(
            "Celery broker URL (`redis://host:6379/0`, `amqp://...`, or Redis Sentinel's "
            "`sentinel://h1:26379;sentinel://h2:26379;...` with DTASK_SENTINEL_MASTER); unset = "
            "embedded Redis"
        ),
    )
    sentinel_master: str | None = Field(
        None,
        description=(
            "the master name the sentinels watch (`sentinel monitor NAME ...`) when "
            "DTASK_BROKER_URL or DTASK_RESULT_BACKEND is a `sentinel://` URL: Celery's "
            "`master_name` transport option, for both"
        ),
    )
    rabbitmq_queue_type: Literal["classic", "quorum"] = Field(
        "classic",
        description=(
            "with a RabbitMQ broker, the type of the queues dtask's workers declare: `quorum` "
            "for replicated quorum queues (Celery's `task_default_queue_type` and "
            "`task_create_missing_queue_type`; docs/deployment.md)"
        ),
    )
    result_backend: str | None = Field(
        default_factory=_default_backend,
        json_schema_extra={
            "shown": "the broker URL if Redis, else embedded (with an embedded broker)"
        },
        description=(
            "Celery result backend: any; the run's last child finalizes the run (with Redis, "
            "children sent one to a message also form a chord whose callback would); children "
            "store no result there"
        ),
    )
    templates: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description=(
            "comma-separated modules that register templates, and TOML files of command"
            " templates (paths ending in .toml; docs/commands.md)"
        ),
    )
    max_children: int = Field(
        100_000,
        ge=1,
        le=100_000_000,
        description="largest split a run may have",
    )
    max_child_result: int = Field(
        65_536,
        ge=0,
        le=_MAX_JSON,
        description=(
            "bytes of JSON a child function may return (over it, the attempt fails saying so)"
        ),
    )
    max_child_log: int = Field(
        16_384,
        ge=0,
        le=1_048_576,
        description=(
            "characters of output (stdout, stderr, ctx.log) kept per attempt of a child,"
            " the last ones (`dtask logs`), and written to the worker's log, the first ones"
            " (then one line says how many more there were); 0 keeps and logs none"
        ),
    )
    max_output_line: int = Field(
        65_536,
        ge=80,
        le=16_777_216,
        description=(
            "bytes of one line a command child prints that are read: a longer line is cut"
            " and marked, never read whole into memory"
        ),
    )
    max_run_result: int = Field(
        1_048_576,
        ge=0,
        le=_MAX_JSON,
        description=(
            "bytes of JSON a template's `reduce` may return (over it, the run fails saying so)"
        ),
    )
    max_variables: int = Field(
        1_048_576,
        ge=2,
        le=_MAX_JSON,
        description=(
            "bytes of JSON one run's variables may take (a bigger submit or schedule is refused, "
            "nothing created)"
        ),
    )
    max_child_spec: int = Field(
        65_536,
        ge=2,
        le=_MAX_JSON,
        description=(
            "bytes of JSON one child's spec may take (a split making a bigger one fails its run)"
        ),
    )
    max_checkpoint: int = Field(
        1_048_576,
        ge=2,
        le=_MAX_JSON,
        description=(
            "bytes of JSON one checkpoint may take (a bigger one fails the attempt saying so)"
        ),
    )
    # A 1,000-run batch of realistic variables weighs 0.44-0.62 MB (docs/api.md): 4 MiB
    # leaves about 4 KiB a run, and one run at DTASK_MAX_VARIABLES fits.
    api_max_body: int = Field(
        4_194_304,
        ge=1_024,
        le=1_073_741_824,
        description=(
            "bytes of body one HTTP request to `dtask serve` may send: a bigger one is refused"
            " with 413 from its Content-Length, or once that many bytes have streamed in"
        ),
    )
    api_body_timeout: float = Field(
        30.0,
        gt=0,
        le=_HOUR,
        description=(
            "seconds a request's whole body may take to arrive at `dtask serve` (4 MiB at 140"
            " KB/s): past it, 408 and the connection closed"
        ),
    )
    api_max_connections: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description=(
            "requests `dtask serve` handles at once (past it: 503 at once, the body unread);"
            " default 512, or half the open-file limit where that is lower"
        ),
    )
    split_timeout: float = Field(
        30.0,
        gt=0,
        le=_HOUR,
        description=(
            "seconds a template's split may run before its run fails (it runs inside a "
            "transaction: keep it below `DTASK_DB_IDLE_IN_TRANSACTION_TIMEOUT`)"
        ),
    )
    retention: float = Field(
        30.0,
        ge=0,
        le=36_500,
        description=(
            "days a finished run is kept, with its children, before the reaper prunes it (`0`: "
            "for ever; `dtask prune` by hand)"
        ),
    )
    lease_ttl: float = Field(
        8.0,
        ge=1.0,
        le=_DAY,
        description=(
            "seconds a child's lease lasts without a heartbeat: how soon a dead worker's child is "
            "taken over"
        ),
    )
    heartbeat_interval: float = Field(
        default_factory=lambda data: data.get("lease_ttl", 8.0) / 4,
        ge=0.1,
        le=_DAY,
        json_schema_extra={"shown": "lease TTL / 4"},
        description="seconds between a running child's lease renewals (a thread, not your loop)",
    )
    reaper_interval: float = Field(
        1.0,
        ge=0.1,
        le=_HOUR,
        description=(
            "seconds between reaper passes (one reaper runs at a time, inside the workers)"
        ),
    )
    stall_timeout: float = Field(
        15.0,
        ge=1.0,
        le=_DAY,
        description=(
            "seconds a child's message may wait unclaimed before it counts as lost and is "
            "re-sent, or a run stay pending/splitting before its master is re-sent"
        ),
    )
    resend_batch: int = Field(
        100,
        ge=1,
        le=100_000,
        description=(
            "unclaimed messages re-sent per queue every half stall timeout while the queue moves "
            "and its broker queue holds as many as PostgreSQL expects (more when it holds fewer)"
        ),
    )
    dispatch: Literal["all", "window"] = Field(
        "window",
        description=(
            "`window`: children wait in PostgreSQL and the dispatcher keeps a bounded window in "
            "the broker, in priority, deadline and fair-share order "
            "([docs/scheduling.md](docs/scheduling.md)); `all`: a run's split sends every child "
            "to the broker at once (no priorities, fair share or `--max-running`)"
        ),
    )
    max_backlog: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        json_schema_extra={"shown": "no cap"},
        description=(
            "runs a queue may hold unfinished (pending, splitting, running), shared among its "
            "clients: once it is full, a client holding its share (the cap divided among the "
            "clients with runs in it) is refused at once with `busy` (exit 4, HTTP 503 with "
            "Retry-After), nothing created; the others' shares may take it to twice the cap"
        ),
    )
    max_client_backlog: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        json_schema_extra={"shown": "no cap"},
        description="the same cap on each client's unfinished runs, whatever their queues",
    )
    dispatch_window: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        json_schema_extra={"shown": "from the slots"},
        description=(
            "with `window`: messages a queue may hold; unset, two per live worker slot plus two "
            "dispatcher passes' worth of the queue's pace"
        ),
    )
    dispatch_interval: float = Field(
        0.05,
        ge=0.005,
        le=5.0,
        description="with `window`: seconds between dispatcher passes while children wait",
    )
    drain_grace: float = Field(
        5.0,
        ge=0.0,
        le=_HOUR,
        description=(
            "seconds a stopping worker's child gets to reach a checkpoint before it is released "
            "anyway"
        ),
    )
    default_execution_cap: float | None = Field(
        None,
        gt=0,
        le=366 * _DAY,
        json_schema_extra={"shown": "none"},
        description=(
            "seconds one attempt of a child may run where neither its run nor its template sets "
            "an execution cap; unset = no cap"
        ),
    )
    execution_cap_grace: float = Field(
        5.0,
        ge=0.0,
        le=_HOUR,
        description=(
            "seconds a child over its execution cap gets to stop at its next step before its pool "
            "process is killed (checked at each heartbeat)"
        ),
    )
    checkpoint_interval: float = Field(
        1.0,
        ge=0.0,
        le=_DAY,
        description="`ctx.resume` writes a checkpoint after this many seconds...",
    )
    checkpoint_every: int = Field(
        10_000,
        ge=1,
        le=2**31 - 1,
        description="...or after this many items, whichever comes first",
    )
    retry_delay: float = Field(
        1.0,
        ge=0.0,
        le=_DAY,
        description="seconds before a failed child's next attempt",
    )
    network_timeout: float = Field(
        8.0,
        ge=1.0,
        le=_HOUR,
        description=(
            "seconds a silent connection to PostgreSQL or the broker (a link that drops packets) "
            "is given before it is dropped and reopened: TCP keepalive and user timeout, connect "
            "timeout, Redis socket timeouts and health checks, AMQP heartbeats; a PostgreSQL round"
            " trip unanswered for half of it, with a new connection unanswered too, is dropped"
        ),
    )
    db_statement_timeout: float = Field(
        60.0,
        ge=0.0,
        le=_DAY,
        description=(
            "seconds a PostgreSQL statement may run (`0`: no limit; migrations are exempt)"
        ),
    )
    db_lock_timeout: float = Field(
        30.0,
        ge=0.0,
        le=_DAY,
        description=(
            "seconds a PostgreSQL statement may wait for a lock (`0`: no limit; migrations are "
            "exempt)"
        ),
    )
    db_idle_in_transaction_timeout: float = Field(
        60.0,
        ge=0.0,
        le=_DAY,
        description="seconds a transaction may sit idle before PostgreSQL ends it (`0`: no limit)",
    )
    db_pool: int = Field(
        4,
        ge=2,
        le=1000,
        description=(
            "PostgreSQL connections a process may hold: a client, `dtask serve`, and a worker "
            "with `-P threads` (its children share them) or `-P solo`; a prefork worker's main "
            "process holds 2 and each pool process 1. A worker that would take the server "
            "past `max_connections` refuses to start (docs/scaling.md)"
        ),
    )
    db_pooler: Literal["auto", "none", "transaction"] = Field(
        "auto",
        description=(
            "`transaction`: the database URL is a pooler that shares server connections "
            "between transactions (PgBouncer's `pool_mode = transaction`): no startup options, "
            "no prepared statements, bounds set per transaction. `auto`: so when the server "
            "refuses or drops dtask's startup options. `none`: never"
        ),
    )
    flower_auth: SecretStr | None = Field(
        None,
        json_schema_extra={"shown": "(generated)"},
        description=(
            "`user:password` for Flower's basic auth (no comma); required when Flower listens "
            "beyond loopback; unset on loopback: user `dtask`, password generated into "
            "`DTASK_HOME/flower-password`"
        ),
    )
    # Alerts (the monitor in every worker and `dtask serve`): thresholds in seconds.
    idle_alert: float = Field(
        900.0,
        gt=0,
        le=_YEAR,
        description=(
            "seconds a live worker may run no child before a `worker_idle` alert says it could be "
            "removed"
        ),
    )
    stall_alert: float = Field(
        600.0,
        gt=0,
        le=_YEAR,
        description=(
            "seconds an unfinished run may go without any change (no child started, checkpointed "
            "or finished) before a `run_stalled` alert"
        ),
    )
    misfire_alert: float = Field(
        3600.0,
        gt=0,
        le=_YEAR,
        description=(
            "seconds a `schedule_misfired` alert stays open after slots were missed (a schedule "
            "whose slots cannot run stays an alert until they can)"
        ),
    )
    lost_messages_alert: float = Field(
        600.0,
        gt=0,
        le=_YEAR,
        description=(
            "seconds a `messages_lost` alert stays open after the reaper last found a queue's "
            "broker short of messages PostgreSQL had sent (and re-sent them)"
        ),
    )
    worker_forget: float = Field(
        3600.0,
        gt=0,
        le=_YEAR,
        description=(
            "seconds after which a worker that stopped reporting is forgotten (its `worker_lost` "
            "alert closes)"
        ),
    )
    alert_webhook: SecretStr | None = Field(
        None,
        description=(
            'URL POSTed `{"event": "opened"|"closed", "alert": {...}}` as each alert opens and '
            "closes (never logged: it may hold a secret)"
        ),
    )
    # a run's notify_url may reach loopback, private, link-local... addresses (docs/security.md)
    notify_allow_private: bool = Field(
        False,
        description=(
            "`1`: a run's `notify_url` may be a loopback, private, link-local or other non-global "
            "address (off: refused at submit when written as such an address, and at delivery "
            "when its name resolves to one; the alert webhook always may)"
        ),
    )
    # test mode: runs execute in this process, at submit, and nothing goes to the broker
    eager: bool = Field(
        False,
        description=(
            "`1` (or Celery's `task_always_eager`, `CELERY_TASK_ALWAYS_EAGER` in Django): test "
            "mode. A submit runs its run in its own process before it returns (the split, each "
            "child through the worker's lifecycle with its attempts and checkpoints, the reduce) "
            "and sends nothing to the broker; in a Django project whose `default` database is "
            "PostgreSQL, dtask keeps its tables in that database (`manage.py test`'s test "
            "database, created on first use). Never in production"
        ),
    )
    # a burst of single submits shares its masters' messages (dtask/worker/pickup.py)
    pickup: bool = Field(
        True,
        description=(
            "where the broker is Redis, a submitted run due now (no countdown, eta or "
            "upstream) waits for a pickup instead of sending its own master message: a "
            "`dtask.pickup` task takes the runs waiting, so a burst of submits costs a few "
            "messages and its runs share their writes (about twice the runs a second: "
            'docs/benchmarks.md, "many small runs"). Flower then shows `dtask.pickup` and '
            "`dtask.masters` tasks, not a `dtask.master` task per run; `0`: one master "
            "message per run"
        ),
    )
    # dtask's beat also sends the app's own beat_schedule entries (off: another beat does,
    # django-celery-beat's, and dtask's fires only dtask's schedules)
    beat_app_entries: bool = Field(
        True,
        description=(
            "`0`: dtask's beat (`dtask beat`, `celery -A proj beat -S "
            "dtask.worker.beat:DatabaseScheduler`) fires only dtask's schedules and leaves your "
            "app's own `beat_schedule` entries to another beat, such as django-celery-beat's "
            "(`CELERY_DTASK_BEAT_APP_ENTRIES = False` in a Django project; "
            "[docs/scheduling.md](docs/scheduling.md#beat-beside-django-celery-beat)); `1`: it "
            "sends them too, one beat at a time"
        ),
    )

    @field_validator("home")
    @classmethod
    def _absolute(cls, home: Path) -> Path:
        return home.expanduser().absolute()

    @field_validator("templates", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(m.strip() for m in value.split(",") if m.strip())
        return value

    @field_validator("templates")
    @classmethod
    def _module_names(cls, modules: tuple[str, ...]) -> tuple[str, ...]:
        for module in modules:
            if not (_MODULE.fullmatch(module) or module.endswith(".toml")):
                raise ValueError(
                    f"names {module[:60]!r}, which is neither a module name (dotted, like"
                    " myjobs.templates) nor a TOML file of command templates (jobs.toml)"
                )
        return modules

    @field_validator("database_url")
    @classmethod
    def _a_postgresql_url(cls, url: str | None) -> str | None:
        if url is not None:
            urls.checked(url, "postgresql://user:password@host:5432/dbname")
            urls.check_postgresql_query(url)
            scheme = url.partition("://")[0]  # SQLAlchemy's dialect names are lower case
            if scheme not in urls.POSTGRESQL:
                raise ValueError(
                    f"must be a PostgreSQL URL (postgresql:// or postgresql+psycopg://),"
                    f" not {scheme}://"
                )
        return url

    @field_validator("alert_webhook")
    @classmethod
    def _a_webhook(cls, url: SecretStr | None) -> SecretStr | None:
        try:  # what the outbound call reads, checked as a run's notify_url is
            check_url(None if url is None else url.get_secret_value(), allow_private=True)
        except InvalidNotifyUrl:
            raise ValueError(  # not the URL: it may hold a secret
                "must be an http(s) URL with a host, at most 2000 characters, no spaces or"
                " control characters, its port from 1 to 65535"
            ) from None
        return url

    @field_validator("broker_url")
    @classmethod
    def _a_broker_url(cls, url: str | None) -> str | None:
        for one in urls.failover(url):
            urls.checked(one, "redis://host:6379/0 or amqp://user:password@host:5672//")
        return url

    @field_validator("result_backend")
    @classmethod
    def _a_url(cls, url: str | None) -> str | None:
        # Any Celery result backend: with one that counts chords natively (Redis) a run's
        # chord callback finalizes it, with any other its last child does (from PostgreSQL).
        for one in urls.failover(url):
            urls.checked(one, "redis://host:6379/1 or db+postgresql://...")
        return url

    @model_validator(mode="after")
    def _a_sentinel_master(self) -> Settings:
        named = [
            env_name(f) for f in ("broker_url", "result_backend") if is_sentinel(getattr(self, f))
        ]
        if named and not self.sentinel_master:
            raise ValueError(
                f"{named[0]} is a sentinel:// URL: set DTASK_SENTINEL_MASTER to the name of the"
                " master its sentinels watch (sentinel monitor NAME ...)"
            )
        return self

    @field_validator("heartbeat_interval")
    @classmethod
    def _under_half_the_lease(cls, beat: float, info: ValidationInfo) -> float:
        lease = info.data.get("lease_ttl")
        if lease is not None and beat >= lease / 2:
            raise ValueError(
                f"must be under half of DTASK_LEASE_TTL ({lease:g}),"
                " or leases expire between heartbeats"
            )
        return beat

    @model_validator(mode="after")
    def _split_within_its_transaction(self) -> Settings:
        idle = self.db_idle_in_transaction_timeout
        if idle and self.split_timeout >= idle:
            raise ValueError(
                f"DTASK_SPLIT_TIMEOUT ({self.split_timeout:g}) must be below"
                f" DTASK_DB_IDLE_IN_TRANSACTION_TIMEOUT ({idle:g}): a split runs inside the"
                " run's transaction"
            )
        return self

    @field_validator("flower_auth")
    @classmethod
    def _user_and_password(cls, auth: SecretStr | None) -> SecretStr | None:
        if auth is not None:
            user, sep, password = auth.get_secret_value().partition(":")
            if not (user and sep and password):
                raise ValueError("must be user:password (both non-empty)")
            if "," in user or "," in password:
                raise ValueError("must be one user:password without a comma (Flower splits there)")
        return auth

    @property
    def worker_seen_within(self) -> float:
        """Seconds since a worker last reported itself (every reaper pass) after which it no
        longer counts as live."""
        return max(3 * self.reaper_interval, self.lease_ttl)

    @property
    def embedded_database(self) -> bool:
        return self.database_url is None

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url is None

    @property
    def embedded_result_backend(self) -> bool:
        return self.result_backend is None

    def mixed_services(self) -> str | None:
        """Why this mix of configured and embedded services cannot work, if it cannot: the
        embedded ones are private to this machine, so other machines would never see them."""
        named = {
            "DTASK_DATABASE_URL": self.database_url,
            "DTASK_BROKER_URL": self.broker_url,
            "DTASK_RESULT_BACKEND": self.result_backend,
        }
        unset = [name for name, url in named.items() if url is None]
        if not unset or len(unset) == len(named):
            return None
        given = [name for name in named if name not in unset]
        return (
            f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} set but"
            f" {' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} not: this process would"
            " use an embedded service only this machine sees; set all three (the result backend"
            " defaults to a Redis broker's URL) or none"
        )


def env_name(field: str) -> str:
    return PREFIX + field.upper()


_URLS = {"database_url", "broker_url", "result_backend"}
_SECRETS = {"flower_auth", "alert_webhook"}
_DERIVED = {"result_backend", "heartbeat_interval"}
_NOT_DERIVED = "default_factory_not_called"
KNOWN = {env_name(f): f for f in Settings.model_fields}


def documented() -> list[tuple[str, str, str]]:
    """(variable, default, meaning) of every setting, from the fields: the README's table."""
    found = []
    for name, field in Settings.model_fields.items():
        extra = field.json_schema_extra
        default = field.get_default(call_default_factory=False)
        if isinstance(extra, dict) and "shown" in extra:
            shown = str(extra["shown"])
        elif isinstance(default, bool):
            shown = f"`{int(default)}`"
        elif default is None or default == ():
            shown = "(none)"
        else:
            shown = f"`{_number(default)}`"
        found.append((env_name(name), shown, field.description or ""))
    return found


def table() -> str:
    """The README's configuration table (tests/unit/test_settings.py keeps it equal)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for variable, default, meaning in documented():
        escaped = meaning.replace("|", "\\|")  # a pipe in a cell would end it
        lines.append(f"| `{variable}` | {default} | {escaped} |")
    return "\n".join(lines) + "\n"


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _reason(error: ErrorDetails) -> str:
    ctx = error.get("ctx", {})
    kind = error["type"]
    if kind == "value_error":
        return str(ctx["error"])
    if kind in ("greater_than_equal", "greater_than"):
        sign, bound = (">=", ctx["ge"]) if kind == "greater_than_equal" else (">", ctx["gt"])
        return f"must be {sign} {_number(bound)}"
    if kind.startswith("int_"):
        return "must be a valid integer"
    if kind.startswith("float_"):
        return "must be a number"
    if kind == "finite_number":
        return "must be a finite number"
    return error["msg"].replace("Input should be", "must be")


def _problem(error: ErrorDetails) -> str:
    field = str(error["loc"][0]) if error["loc"] else ""
    if field not in KNOWN.values():
        return _reason(error)
    value = error["input"]
    if field in _SECRETS:
        return f"{env_name(field)} {_reason(error)}"  # not even part of the value
    if field in _URLS and isinstance(value, str):
        value = mask(value)
    return f"{env_name(field)}={value!r} {_reason(error)}"


def _typos(environ: Mapping[str, str]) -> list[str]:
    problems = []
    suffixes = [known.removeprefix(PREFIX) for known in KNOWN]
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in KNOWN:
            continue
        close = difflib.get_close_matches(upper.removeprefix(PREFIX), suffixes, n=1, cutoff=0.8)
        if close:
            problems.append(f"{name} is not a dtask setting (did you mean {PREFIX}{close[0]}?)")
    return problems


def secrets_dir() -> Path | None:
    """Where settings may also come from files named like them in lower case
    (``dtask_database_url``): Docker's and Compose's ``/run/secrets``, or DTASK_SECRETS_DIR.
    A variable of the same name wins over a file."""
    folder = Path(os.environ.get("DTASK_SECRETS_DIR") or "/run/secrets")
    return folder if folder.is_dir() else None


def load() -> Settings:
    """The settings from the environment (then the installed source); every problem in one
    ConfigurationError line."""
    problems = _typos(os.environ)
    given = {}
    source = settings_source.current() or settings_source.Source(dict, frozenset())
    for name, value in source.read().items():
        variable = os.environ.get(env_name(name))
        if name not in Settings.model_fields or (variable and name not in source.fixed):
            continue
        if variable and variable != value:
            problems.append(
                f"{env_name(name)} is set, but this process sends through its Celery app's"
                f" {name.removesuffix('_url').replace('_', ' ')} ({mask(str(value))}): unset it"
            )
        given[name] = value
    secrets = secrets_dir()
    try:
        settings = Settings(_secrets_dir=secrets, **given)
    except ValidationError as exc:
        # A derived default is not computed when what it derives from is invalid: no news.
        errors = [e for e in exc.errors(include_url=False) if e["type"] != _NOT_DERIVED]
        problems = [_problem(e) for e in errors] + problems
    except SettingsError as exc:
        problems = [str(exc), *problems]
    except OSError as exc:  # a secret file this process may not read
        problems = [f"cannot read a setting's file in {secrets}: {exc.strerror}", *problems]
    if problems:
        raise ConfigurationError("; ".join(problems))
    return settings


class Row(NamedTuple):
    name: str
    value: str | int | float | list[str] | None  # JSON-ready, secrets masked
    source: str  # env, app (a host Celery app's dtask_* key), default or derived


def rows(settings: Settings) -> list[Row]:
    """What `dtask config` shows: every setting's effective value and where it came from."""
    found = []
    for field in Settings.model_fields:
        value = getattr(settings, field)
        if isinstance(value, SecretStr):
            value = value.get_secret_value().partition(":")[0] + ":***"
        elif isinstance(value, Path):
            value = str(value)
        elif isinstance(value, tuple):
            value = list(value)
        elif field in _URLS and value is not None:
            value = mask(value)
        secrets = secrets_dir()
        if os.environ.get(env_name(field)):
            source = "env"
        elif secrets is not None and (secrets / env_name(field).lower()).is_file():
            source = "file"
        elif field in settings.model_fields_set:
            source = "app"
        else:
            source = "derived" if field in _DERIVED else "default"
        found.append(Row(env_name(field), value, source))
    return found


def render(found: list[Row]) -> list[str]:
    """Rows as aligned `DTASK_NAME  value  (source)` lines."""

    def text(row: Row) -> str:
        if row.value is None or row.value == []:
            return "embedded" if KNOWN[row.name] in _URLS else "(none)"
        if isinstance(row.value, list):
            return ",".join(row.value)
        return _number(row.value)

    texts = [text(row) for row in found]
    wide_name = max(len(row.name) for row in found)
    wide_value = max(len(t) for t in texts)
    return [
        f"{row.name:<{wide_name}}  {t:<{wide_value}}  ({row.source})"
        for row, t in zip(found, texts, strict=True)
    ]


_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;][^=&;]*(?:pass|pwd|secret|token)[^=&;]*=)(?P<secret>.*?)(?=&[^&=]*=|\Z)",
    re.IGNORECASE | re.DOTALL,
)


def mask(url: str) -> str:
    """A URL fit for logs and terminals: the password replaced by ***.

    Passwords may hold unescaped `@`, `:` or `/`, so the userinfo is taken to end at the LAST `@`
    and the password to start at the first `:` in it; a stray `@` later on over-masks, never leaks.
    A Sentinel URL is masked sentinel by sentinel.
    """
    return ";".join(_mask_one(one) for one in _urls(url))


def shown_url(url: object) -> str:
    """A database URL (SQLAlchemy's URL, or its text) for a message or a log line: mask()ed,
    so that a password in its query (``?password=``, ``?sslpassword=``) goes with the
    userinfo's (SQLAlchemy's own ``hide_password`` hides only the latter)."""
    return mask(str(url))  # str() of a SQLAlchemy URL hides the userinfo's password


def _mask_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if colon and password:
            rest = f"{user}:***@{host}"
    masked = f"{scheme}{sep}{rest}"
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}***", masked)
