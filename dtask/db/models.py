"""SQLAlchemy 2 models. The migration in ``migrations/`` must match them (a test checks)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from dtask.domain.clients import (
    DEFAULT_CLIENT,
    DEFAULT_PRIORITY,
    HIGHEST_PRIORITY,
    LOWEST_PRIORITY,
    PERIODS,
    Tier,
)
from dtask.domain.deadlines import OnLate
from dtask.domain.notify import Delivery
from dtask.domain.runs import ChildState, RunState
from dtask.domain.schedules import Misfire, Overlap

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _one_of(
    values: type[RunState]
    | type[ChildState]
    | type[Misfire]
    | type[Overlap]
    | type[Tier]
    | type[OnLate]
    | type[Delivery],
    column: str = "state",
) -> str:
    return f"{column} IN (" + ", ".join(f"'{v.value}'" for v in values) + ")"


_PERIODS = ", ".join(f"'{p}'" for p in PERIODS)
# psycopg and datetime read no moment past 9999 (in any session time zone): PostgreSQL refuses
# to store one, so a value past the bounds of dtask.domain.limits fails its own insert, never
# every later read (migration 0027)
_READABLE = "'9999-01-01 00:00:00+00'"


def _readable(*columns: str) -> list[CheckConstraint]:
    return [CheckConstraint(f"{c} < {_READABLE}", name=f"{c}_readable") for c in columns]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RunRow(Base):
    __tablename__ = "dtask_runs"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    template: Mapped[str] = mapped_column(String(100))
    trigger_key: Mapped[str] = mapped_column(String(300))  # unique per client (see below)
    variables: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), server_default=RunState.PENDING.value)
    max_attempts: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str | None] = mapped_column(String(200))
    child_total: Mapped[int | None] = mapped_column(Integer)
    group_id: Mapped[str | None] = mapped_column(String(100))
    chord_size: Mapped[int | None] = mapped_column(Integer)
    execution_cap: Mapped[float | None] = mapped_column(Float)  # NULL: the template's
    client: Mapped[str] = mapped_column(String(100), server_default=DEFAULT_CLIENT)
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text(str(DEFAULT_PRIORITY)))
    # what a child rate limit charged at submit (a split that cannot count: NULL, then child_total)
    expected_children: Mapped[int | None] = mapped_column(Integer)
    delay_tolerance: Mapped[float | None] = mapped_column(Float)
    deadline: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    on_late: Mapped[str] = mapped_column(String(8), server_default=OnLate.RUN.value)
    late: Mapped[bool | None] = mapped_column(Boolean)  # NULL: not decided yet
    tier: Mapped[str] = mapped_column(String(16), server_default=Tier.BASIC.value)
    notify_url: Mapped[str | None] = mapped_column(Text)
    notify_state: Mapped[str | None] = mapped_column(String(12))  # NULL: no notify_url
    notify_attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    notify_next_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    notify_error: Mapped[str | None] = mapped_column(Text)
    notified_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    unsent: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # children not sent
    # the dispatcher has taken its children below this index (DTASK_DISPATCH=window): a
    # pending child below it whose sent_at is NULL is in a message of dtask_messages
    sent_through: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # a child's time in a pool process, claim to finish (a moving average its workers keep):
    # how many of its children the dispatcher puts in one message
    child_seconds: Mapped[float | None] = mapped_column(Float)
    dispatches: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    master_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # a single submit's run whose master a pickup sends (dtask/worker/pickup.py), until then
    awaits_pickup: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    start_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # countdown
    result: Mapped[Any | None] = mapped_column(JSONB)  # the template's reduce of its children's
    # the rest of the Celery chains (and link/link_error) its dtask.submit tasks took over:
    # sent once the run has finished, then NULL
    chains: Mapped[list[Any] | None] = mapped_column(JSONB)
    # the live worker slots its split saw, where the split was by capacity (parts="slots")
    split_slots: Mapped[int | None] = mapped_column(Integer)
    # cancelled with --terminate: a running child that does not stop is killed (migration 0033)
    terminate: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    # at most max_concurrent unfinished runs of a client per key (dtask.db.concurrency)
    concurrency_key: Mapped[str | None] = mapped_column(String(200))
    max_concurrent: Mapped[int | None] = mapped_column(Integer)
    # its submit's trace context (W3C headers), where the submit was traced (migration 0037)
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    schedule: Mapped[str | None] = mapped_column(String(100))
    slot: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        # a trigger key is the client's own: one run per (client, key); its index serves every
        # lookup by key, each within a client
        UniqueConstraint("client", "trigger_key"),
        CheckConstraint(_one_of(RunState), name="state"),
        *_readable("deadline", "start_after", "slot"),
        Index(None, "state", postgresql_where=text("state IN ('pending', 'splitting', 'running')")),
        Index(None, "schedule", "id", postgresql_where=text("schedule IS NOT NULL")),
        Index("ix_dtask_runs_id_waiting", "id", postgresql_where=text("state = 'waiting'")),
        Index("ix_dtask_runs_id_chained", "id", postgresql_where=text("chains IS NOT NULL")),
        Index(
            "ix_dtask_runs_concurrency",
            "client",
            "concurrency_key",
            "id",
            postgresql_where=text("concurrency_key IS NOT NULL"),
        ),
        Index(
            None,
            "finished_at",
            postgresql_where=text("state IN ('succeeded', 'failed', 'cancelled')"),
        ),
        Index(None, "schedule", "slot", postgresql_where=text("schedule IS NOT NULL")),
        Index(None, "client", "created_at"),
        Index(None, "deadline", postgresql_where=text("late IS NULL AND deadline IS NOT NULL")),
        CheckConstraint(_one_of(OnLate, "on_late"), name="on_late"),
        CheckConstraint(_one_of(Tier, "tier"), name="tier"),
        CheckConstraint(_one_of(Delivery, "notify_state"), name="notify_state"),
        Index(None, "notify_next_at", postgresql_where=text("notify_state = 'waiting'")),
        Index(None, "unsent", postgresql_where=text("unsent > 0")),
        # a pickup reads the runs waiting for it (dtask/worker/pickup.py)
        Index(
            "ix_dtask_runs_awaits_pickup",
            text("priority DESC"),
            "id",
            postgresql_where=text("state = 'pending' AND awaits_pickup"),
        ),
        # a one-child run's master takes the pending runs of its template and priority with it
        Index(
            "ix_dtask_runs_pending_template",
            "template",
            "priority",
            "id",
            postgresql_where=text("state = 'pending'"),
        ),
        # the dispatcher's read of the runs it may send from: per client, queue and template,
        # in the order of dtask.domain.dispatch.plan
        Index(
            "ix_dtask_runs_dispatch_order",
            "client",
            text("coalesce(queue, '')"),
            "template",
            text("priority DESC"),
            "deadline",
            "id",
            postgresql_where=text("unsent > 0 AND state = 'running'"),
        ),
        CheckConstraint(
            f"priority BETWEEN {LOWEST_PRIORITY} AND {HIGHEST_PRIORITY}", name="priority"
        ),
    )


class ChildRow(Base):
    __tablename__ = "dtask_children"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("dtask_runs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(String(16), server_default=ChildState.PENDING.value)
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    max_attempts: Mapped[int] = mapped_column(Integer)
    fence: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    checkpoint: Mapped[Any | None] = mapped_column(JSONB)
    result: Mapped[Any | None] = mapped_column(JSONB)  # the child function's return value
    traceback: Mapped[str | None] = mapped_column(Text)  # of its latest failed attempt
    output: Mapped[str | None] = mapped_column(Text)  # the last lines that attempt printed
    worker: Mapped[str | None] = mapped_column(String(200))  # host:pid that ran that attempt
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # when its latest message was published: a pending child not claimed long after is lost;
    # NULL: waiting in PostgreSQL for the dispatcher (DTASK_DISPATCH=window)
    sent_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    # straggler stealing (docs/elastic.md): asked to give the rest's second half away at its
    # next checkpoint; how many cuts made its range what it is
    give_away: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    cuts: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))

    __table_args__ = (
        UniqueConstraint("run_id", "index"),
        CheckConstraint(_one_of(ChildState), name="state"),
        CheckConstraint("attempt >= 0 AND attempt <= max_attempts", name="attempt"),
        Index(None, "run_id", "state", "index"),  # a claim probes only its message's children
        # "lease_expires_at IS NOT NULL": a write to one child by its id says "state =
        # 'running'" too, and must never be planned through this index instead of the key
        Index(
            None,
            "lease_expires_at",
            postgresql_where=text("state = 'running' AND lease_expires_at IS NOT NULL"),
        ),
        Index(None, "sent_at", postgresql_where=text("state = 'pending'")),
        Index(
            None, "run_id", "index", postgresql_where=text("state = 'pending' AND sent_at IS NULL")
        ),
        # the dispatcher's count of each running run's children out in the broker
        Index(None, "run_id", postgresql_where=text("state = 'pending' AND sent_at IS NOT NULL")),
    )


class MessageRow(Base):
    """A message of several children of a run the dispatcher sent (``lo``..``hi``, ``children``
    of them), its children not written when it was: unclaimed (``claimed_at`` NULL) it is out
    in the broker, and lost once it has been for a stall timeout (``RecoveryStore``); owned,
    its worker runs the ``children`` it still covers under its lease."""

    __tablename__ = "dtask_messages"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("dtask_runs.id", ondelete="CASCADE"))
    lo: Mapped[int] = mapped_column(Integer)
    hi: Mapped[int] = mapped_column(Integer)
    children: Mapped[int] = mapped_column(Integer)
    sent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # its claim (db/message_claims.py): the children it covers are written under this fence
    fence: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    owner: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        UniqueConstraint("run_id", "lo"),  # a worker's claim finds its message by its first child
        Index(None, "sent_at", postgresql_where=text("claimed_at IS NULL")),
        Index(None, "run_id", "lease_expires_at", postgresql_where=text("owner IS NOT NULL")),
    )


class ChildLogRow(Base):
    """An attempt's output: one that failed, or one running that printed (its heartbeat
    writes it); a succeeded attempt's stays in ``dtask_children.output``."""

    __tablename__ = "dtask_child_logs"

    run_id: Mapped[int] = mapped_column(
        ForeignKey("dtask_runs.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker: Mapped[str | None] = mapped_column(String(200))
    state: Mapped[str] = mapped_column(String(16))
    output: Mapped[str | None] = mapped_column(Text)
    skipped: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))  # chars not kept
    error: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (CheckConstraint("state IN ('running', 'failed')", name="state"),)


class ScheduleRow(Base):
    __tablename__ = "dtask_schedules"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    template: Mapped[str] = mapped_column(String(100))
    variables: Mapped[dict[str, Any]] = mapped_column(JSONB)
    cron: Mapped[str | None] = mapped_column(String(200))
    every_seconds: Mapped[int | None] = mapped_column(Integer)
    timezone: Mapped[str] = mapped_column(String(64))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    misfire: Mapped[str] = mapped_column(String(16))
    overlap: Mapped[str] = mapped_column(String(16))
    misfire_grace: Mapped[float] = mapped_column(Float)
    catch_up_window: Mapped[float] = mapped_column(Float)
    start_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decided_until: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    buffered_slot: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the earliest a beat must look at it again (its next slot; now while it waits on
    # something else: a buffered slot, an upstream schedule, an error)
    next_due_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    last_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("dtask_runs.id", ondelete="SET NULL")
    )
    last_error: Mapped[str | None] = mapped_column(Text)
    delay_tolerance: Mapped[float | None] = mapped_column(Float)  # NULL: the template's
    on_late: Mapped[str | None] = mapped_column(String(8))  # NULL: the template's
    # each slot's run waits for this schedule's run of the latest slot at or before it
    after_schedule: Mapped[str | None] = mapped_column(String(100))
    misfired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    misfire_note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="trigger"),
        CheckConstraint(_one_of(OnLate, "on_late"), name="on_late"),
        CheckConstraint(_one_of(Misfire, "misfire"), name="misfire"),
        CheckConstraint(_one_of(Overlap, "overlap"), name="overlap"),
        *_readable("next_due_at", "decided_until", "start_at", "end_at"),
        Index("ix_dtask_schedules_next_due_at", "next_due_at", postgresql_where=text("enabled")),
    )


class RunDepRow(Base):
    """A run waits for its upstream (``dtask_run_deps``)."""

    __tablename__ = "dtask_run_deps"

    run_id: Mapped[int] = mapped_column(
        ForeignKey("dtask_runs.id", ondelete="CASCADE"), primary_key=True
    )
    upstream_id: Mapped[int] = mapped_column(
        ForeignKey("dtask_runs.id", ondelete="CASCADE"), primary_key=True, index=True
    )


class ClientRow(Base):
    """A client's limits; a run names its client (no foreign key: removing a client's limits
    keeps its runs). The client ``default`` exists without a row (no limits)."""

    __tablename__ = "dtask_clients"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    rate_count: Mapped[int | None] = mapped_column(Integer)
    rate_period: Mapped[str | None] = mapped_column(String(1))
    child_rate_count: Mapped[int | None] = mapped_column(Integer)
    child_rate_period: Mapped[str | None] = mapped_column(String(1))
    max_running: Mapped[int | None] = mapped_column(Integer)
    weight: Mapped[float] = mapped_column(Float, server_default=text("1"))
    tier: Mapped[str | None] = mapped_column(String(16))
    max_priority: Mapped[int] = mapped_column(
        SmallInteger, server_default=text(str(HIGHEST_PRIORITY))
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())

    __table_args__ = (
        CheckConstraint(f"rate_period IN ({_PERIODS})", name="rate_period"),
        CheckConstraint(f"child_rate_period IN ({_PERIODS})", name="child_rate_period"),
        CheckConstraint("(rate_count IS NULL) = (rate_period IS NULL)", name="rate"),
        CheckConstraint(
            "(child_rate_count IS NULL) = (child_rate_period IS NULL)", name="child_rate"
        ),
        CheckConstraint(_one_of(Tier, "tier"), name="tier"),
        CheckConstraint(
            f"max_priority BETWEEN {LOWEST_PRIORITY} AND {HIGHEST_PRIORITY}", name="max_priority"
        ),
    )


class WorkerRow(Base):
    """A live `dtask worker`, as its main process last reported itself: what it consumes and
    how many children it can run at once. A row not seen for a while is a dead worker's."""

    __tablename__ = "dtask_workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[list[str]] = mapped_column(ARRAY(String(200)))
    slots: Mapped[int] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    busy: Mapped[int] = mapped_column(Integer, server_default=text("0"))  # children running
    idle_since: Mapped[datetime | None] = mapped_column(  # NULL while busy
        DateTime(timezone=True), server_default=func.now(), nullable=True
    )
    templates: Mapped[list[str] | None] = mapped_column(  # NULL: not reported (knows any)
        ARRAY(String(200)), nullable=True
    )
    # its templates' module files as it loaded them: path -> modification time (ns)
    code: Mapped[dict[str, int] | None] = mapped_column(JSONB, nullable=True)


class TokenRow(Base):
    """An API token: the SHA-256 of its secret, never the secret itself."""

    __tablename__ = "dtask_tokens"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    client: Mapped[str] = mapped_column(String(100))
    admin: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookSecretRow(Base):
    """The secret a client's completion notifications are signed with."""

    __tablename__ = "dtask_webhook_secrets"

    client: Mapped[str] = mapped_column(String(100), primary_key=True)
    secret: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AlertRow(Base):
    """An alert: open while its condition holds (at most one open per kind and subject)."""

    __tablename__ = "dtask_alerts"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index(
            "ux_dtask_alerts_open",
            "kind",
            "subject",
            unique=True,
            postgresql_where=text("closed_at IS NULL"),
        ),
    )


class CounterRow(Base):
    """A cluster-wide counter for /metrics: every process adds to the same row."""

    __tablename__ = "dtask_counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    label: Mapped[str] = mapped_column(String(200), primary_key=True, server_default="")
    value: Mapped[float] = mapped_column(Float, server_default=text("0"))


class LostMessagesRow(Base):
    """A queue whose broker held fewer messages than PostgreSQL had sent, as the reaper last
    found it (the ``messages_lost`` alert)."""

    __tablename__ = "dtask_lost_messages"

    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    missing: Mapped[int] = mapped_column(Integer)
    resent: Mapped[int] = mapped_column(Integer)
    found_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class LeaseRow(Base):
    """A named role one process holds at a time until its lease runs out (the beat that
    runs the host app's own ``beat_schedule`` entries)."""

    __tablename__ = "dtask_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
