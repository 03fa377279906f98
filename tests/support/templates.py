"""Templates used by the acceptance tests (loaded by workers through DTASK_TEMPLATES).

Each child appends the items it processes to a file under DTASK_TEST_SINK, one line each, so a
test can check coverage and count re-processed items after a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dtask


def _sink(ctx: dtask.ChildContext) -> Path:
    return Path(os.environ["DTASK_TEST_SINK"]) / f"{ctx.run_id}-{ctx.index}.txt"


@dtask.template(
    "flaky_range",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "fail_at": int},
    skeleton={"start": 1, "end": "${n}", "fail_at": "${fail_at}"},
    split=dtask.RangeSplit("start", "end", chunk=100, carry=("fail_at",)),
    checkpoint_every=10,
    checkpoint_interval=3600,
)
def flaky_range(ctx: dtask.ChildContext, a: int, b: int, fail_at: int) -> None:
    """Raises once (first attempt) when it reaches ``fail_at``; the retry resumes."""
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            if i == fail_at and ctx.attempt == 1:
                raise RuntimeError(f"boom at {i}")
            out.write(f"{i}\n")
            out.flush()


@dtask.template(
    "always_fails",
    params={"n": int, "bad": int},
    skeleton={"start": 1, "end": "${n}", "bad": "${bad}"},
    split=lambda r: [
        {"a": a, "b": min(a + 9, r["end"]), "bad": r["bad"]} for a in range(1, r["end"] + 1, 10)
    ],
    max_attempts=3,
)
def always_fails(ctx: dtask.ChildContext, a: int, b: int, bad: int) -> None:
    with _sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt}\n")
    print(f"checking {a}..{b} (attempt {ctx.attempt})")
    if a <= bad <= b:
        raise ValueError(f"item {bad} is poison")


@dtask.template(
    "free_form",
    params={"steps": dtask.Param(int, min=1, max=50)},
    skeleton={"steps": "${steps}"},
    split=lambda r: [{"steps": r["steps"]}],
)
def free_form(ctx: dtask.ChildContext, steps: int) -> None:
    """Uses ctx.checkpoint/ctx.checkpoint_state directly; fails once halfway."""
    state = ctx.checkpoint_state or {"step": 0, "total": 0}
    with _sink(ctx).open("a") as out:
        while state["step"] < steps:
            if state["step"] == steps // 2 and ctx.attempt == 1:
                raise RuntimeError("halfway")
            state = {"step": state["step"] + 1, "total": state["total"] + state["step"] + 1}
            ctx.checkpoint(state)
            out.write(f"{state['step']}\n")


@dtask.template(
    "slow_range",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=20, carry=("delay",)),
    checkpoint_every=5,
    checkpoint_interval=3600,
)
def slow_range(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    import time

    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            out.write(f"{i}\n")
            out.flush()


@dtask.template(
    "held_range",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "delay": float, "hold": str},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}", "hold": "${hold}"},
    split=dtask.RangeSplit("start", "end", chunk=20, carry=("delay", "hold")),
    checkpoint_every=5,
    checkpoint_interval=3600,
)
def held_range(ctx: dtask.ChildContext, a: int, b: int, delay: float, hold: str) -> None:
    """slow_range whose children, from their 6th item on (5 checkpointed), wait after each
    item while DTASK_TEST_SINK/<hold> exists, until asked to stop: a test decides when they
    may finish, whatever the machine's speed."""
    import time

    gate = Path(os.environ["DTASK_TEST_SINK"]) / hold
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            out.write(f"{i}\n")
            out.flush()
            while i - a >= 5 and gate.exists() and not ctx.should_stop():
                time.sleep(0.05)


@dtask.template(
    "slow_split",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=lambda r: __import__("time").sleep(2) or dtask.RangeSplit("start", "end", chunk=10)(r),
)
def slow_split(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """Its master spends 2 s splitting (inside its first transaction)."""
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            out.write(f"{i}\n")


def _split_when_let(rendered: dict[str, object]) -> list[dict[str, int]]:
    import time

    gate = Path(os.environ["DTASK_TEST_SINK"]) / str(rendered["hold"])
    while gate.exists():
        time.sleep(0.05)
    return dtask.RangeSplit("start", "end", chunk=10)(rendered)


@dtask.template(
    "held_split",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "hold": str},
    skeleton={"start": 1, "end": "${n}", "hold": "${hold}"},
    split=_split_when_let,
)
def held_split(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """Its master splits (inside its first transaction, holding the run's lock) while
    DTASK_TEST_SINK/<hold> exists: a test decides when the split commits."""
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            out.write(f"{i}\n")


@dtask.template(
    "poison",
    params={"n": int, "bad": int},
    skeleton={"start": 1, "end": "${n}", "bad": "${bad}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("bad",)),
)
def poison(ctx: dtask.ChildContext, a: int, b: int, bad: int) -> None:
    """The child holding ``bad`` kills its own process on every attempt."""
    import signal

    with _sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt}\n")
    if a <= bad <= b:
        os.kill(os.getpid(), signal.SIGKILL)


@dtask.template(
    "blocked_range",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=20),
    max_attempts=2,
    checkpoint_every=5,
    checkpoint_interval=3600,
)
def blocked_range(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """Child 0 fails at its 15th item while DTASK_TEST_SINK/block-<run> exists."""
    block = Path(os.environ["DTASK_TEST_SINK"]) / f"block-{ctx.run_id}"
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            if i == 15 and block.exists():
                raise RuntimeError("blocked")
            out.write(f"{i}\n")
            out.flush()


@dtask.template(
    "stubborn",
    params={"steps": int},
    skeleton={"steps": "${steps}"},
    split=lambda r: [{"steps": r["steps"]}],
)
def stubborn(ctx: dtask.ChildContext, steps: int) -> None:
    """Never checkpoints and never asks should_stop(): a drain must wait out its grace."""
    import time

    with _sink(ctx).open("a") as out:
        for i in range(1, steps + 1):
            time.sleep(0.5)
            out.write(f"{i}\n")
            out.flush()


@dtask.template(
    "routed",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    queue="special",
)
def routed(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """Its children go to the 'special' queue only."""
    with _sink(ctx).open("a") as out:
        out.write(f"{os.getpid()}\n")


def _split_with_a_bug(rendered: dict[str, int]) -> list[dict[str, int]]:
    return [{"a": rendered["missing"]}]


@dtask.template("broken_split", params={"n": int}, skeleton={"n": "${n}"}, split=_split_with_a_bug)
def broken_split(ctx: dtask.ChildContext, a: int) -> None:
    """Its split raises KeyError: user code with a bug."""


@dtask.template(
    "long_split",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "seconds": float},
    skeleton={"start": 1, "end": "${n}", "seconds": "${seconds}"},
    split=lambda r: (
        __import__("time").sleep(r["seconds"]) or dtask.RangeSplit("start", "end", chunk=10)(r)
    ),
)
def long_split(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """Its split takes ``seconds`` (longer than a lease, if the test wants)."""
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            out.write(f"{i}\n")


def _hang(ctx: dtask.ChildContext, a: int, b: int, hang_at: int, how: str) -> None:
    """Works up to ``hang_at``, then hangs on every attempt: ``cooperative`` keeps calling
    ctx.checkpoint without progress, ``blocking`` sleeps without ever calling ctx."""
    import time

    done = (ctx.checkpoint_state or {"done": 0})["done"]
    with _sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt} from {done} pid {os.getpid()}\n")
        out.flush()
        for i in ctx.resume(range(a, b + 1), checkpoint_every=1):
            if i == hang_at:
                while how == "cooperative":
                    time.sleep(0.05)
                    ctx.checkpoint(ctx.checkpoint_state)
                time.sleep(3600)
            out.write(f"{i}\n")
            out.flush()


_HANG = {
    "params": {"n": int, "hang_at": int, "how": str},
    "skeleton": {"start": 1, "end": "${n}", "hang_at": "${hang_at}", "how": "${how}"},
    "split": dtask.RangeSplit("start", "end", chunk=100, carry=("hang_at", "how")),
    "max_attempts": 2,
}


@dtask.template("hangs", **_HANG)  # type: ignore[arg-type]
def hangs(ctx: dtask.ChildContext, a: int, b: int, hang_at: int, how: str) -> None:
    """No execution cap of its own: a run sets one (--execution-cap)."""
    _hang(ctx, a, b, hang_at, how)


@dtask.template("hangs_capped", execution_cap=2, **_HANG)  # type: ignore[arg-type]
def hangs_capped(ctx: dtask.ChildContext, a: int, b: int, hang_at: int, how: str) -> None:
    """The template's own execution cap: 2 s per attempt."""
    _hang(ctx, a, b, hang_at, how)


@dtask.template(
    "stamped_range",
    stealable=False,  # its tests check each child's own numbers (docs/elastic.md)
    params={"n": int, "delay": float, "every": int},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}", "every": "${every}"},
    split=dtask.RangeSplit("start", "end", chunk=200, carry=("delay", "every")),
    checkpoint_interval=3600,
)
def stamped_range(ctx: dtask.ChildContext, a: int, b: int, delay: float, every: int) -> None:
    """Each item as `item pid unix-time`: who printed it and when (partition tests).
    Checkpoints every ``every`` items only, so between them nothing but the lease stops it."""
    import time

    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1), checkpoint_every=every):
            time.sleep(delay)
            out.write(f"{i} {os.getpid()} {time.time():.3f}\n")
            out.flush()


@dtask.template(
    "tagged",
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=1, carry=("delay",)),
)
def tagged(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    """One item per child: `<worker's DTASK_TEST_TAG> <start time>`, then ``delay`` seconds."""
    import time

    _sink(ctx).write_text(f"{os.environ.get('DTASK_TEST_TAG', '-')} {time.time():.3f}\n")
    time.sleep(delay)


def _explode(results: list[object]) -> object:
    raise ValueError(f"cannot combine {len(results)} results")


@dtask.template(
    "returns",
    params={"n": int, "what": str},
    skeleton={"start": 1, "end": "${n}", "what": "${what}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("what",)),
    max_attempts=1,
    reduce=lambda results: {"children": len(results), "total": sum(r["sum"] for r in results)},
)
def returns(ctx: dtask.ChildContext, a: int, b: int, what: str) -> object:
    """Returns per ``what``: "sum" a small dict, "big" 100 kB, "set" something not JSON."""
    if what == "big":
        return "x" * 100_000
    if what == "set":
        return {a, b}
    return {"a": a, "b": b, "sum": sum(range(a, b + 1))}


@dtask.template(
    "bad_reduce",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    reduce=_explode,
)
def bad_reduce(ctx: dtask.ChildContext, a: int, b: int) -> int:
    return b - a + 1


@dtask.template(
    "logs",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=1),
)
def logs(ctx: dtask.ChildContext, a: int, b: int) -> None:
    ctx.log.info("working on %s..%s", a, b)


def _first_reduce_hangs(results: list[object]) -> object:
    """The first reduce in a test session writes its pid and hangs (to be SIGKILLed
    mid-finalize); later ones return at once."""
    marker = Path(os.environ["DTASK_TEST_SINK"]) / "hanging-reduce.pid"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        __import__("time").sleep(120)
    return len(results)


@dtask.template(
    "hanging_reduce",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    reduce=_first_reduce_hangs,
)
def hanging_reduce(ctx: dtask.ChildContext, a: int, b: int) -> int:
    with _sink(ctx).open("a") as out:
        out.write(f"{a}..{b}\n")
    return b - a + 1


@dtask.template(
    "endless_split",
    params={"n": int},
    skeleton={"n": "${n}"},
    split=lambda r: ({"a": i} for i in __import__("itertools").count()),
)
def endless_split(ctx: dtask.ChildContext, a: int) -> None:
    """Its split is a generator that never ends: dtask stops it past DTASK_MAX_CHILDREN."""


@dtask.template(
    "hanging_split",
    params={"n": int},
    skeleton={"n": "${n}"},
    split=lambda r: __import__("time").sleep(3600) or [{"a": 1}],
)
def hanging_split(ctx: dtask.ChildContext, a: int) -> None:
    """Its split never returns: DTASK_SPLIT_TIMEOUT fails the run."""


@dtask.template(
    "big_checkpoint",
    params={"kb": int},
    skeleton={"kb": "${kb}"},
    split=lambda r: [{"kb": r["kb"]}],
    max_attempts=1,
)
def big_checkpoint(ctx: dtask.ChildContext, kb: int) -> None:
    ctx.checkpoint({"blob": "x" * (kb * 1024)})


@dtask.template(
    "tiny",
    params={"n": int, "fail_every": int},
    skeleton={"start": 0, "end": "${n}", "fail_every": "${fail_every}"},
    split=lambda r: [{"i": i, "fail_every": r["fail_every"]} for i in range(r["start"], r["end"])],
    max_attempts=2,
)
def tiny(ctx: dtask.ChildContext, i: int, fail_every: int) -> int:
    """A child of about a millisecond that writes its index to the run's sink file; with
    ``fail_every`` > 0, every ``fail_every``-th child fails its first attempt."""
    if fail_every and i % fail_every == 0 and ctx.attempt == 1:
        raise RuntimeError(f"child {i} fails its first attempt")
    with (Path(os.environ["DTASK_TEST_SINK"]) / f"{ctx.run_id}.tiny").open("a") as out:
        out.write(f"{i} {os.getpid()}\n")
    return i


@dtask.template(
    "task_name",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=1),
    reduce=lambda results: results,
)
def task_name(ctx: dtask.ChildContext, a: int, b: int) -> str:
    """The Celery task this child ran in: ``dtask.master`` where its master ran it."""
    from celery import current_task

    return str(current_task.name)


@dtask.template(
    "by_slots",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", parts="slots"),
)
def by_slots(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """As many children as the live slots when it splits (docs/elastic.md)."""
    with _sink(ctx).open("a") as out:
        out.writelines(f"{i}\n" for i in range(a, b + 1))


def _straggle(ctx: dtask.ChildContext, a: int, b: int, delay: float, slow: list[int]) -> None:
    """``delay`` a number, ten times that for the numbers in ``slow`` (its first to last)."""
    import time

    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay * (10 if slow[0] <= i <= slow[1] else 1))
            out.write(f"{i}\n")
            out.flush()


_STRAGGLER: dict[str, object] = {
    "params": {"n": int, "delay": float, "slow_from": int, "slow_to": int},
    "skeleton": {
        "start": 1,
        "end": "${n}",
        "delay": "${delay}",
        "slow": ["${slow_from}", "${slow_to}"],
    },
    "split": dtask.RangeSplit("start", "end", parts=4, carry=("delay", "slow")),
    "checkpoint_every": 5,
    "checkpoint_interval": 3600,
}


@dtask.template("straggler", **_STRAGGLER)  # type: ignore[arg-type]
def straggler(ctx: dtask.ChildContext, a: int, b: int, delay: float, slow: list[int]) -> None:
    """Four children, the one holding ``slow_from..slow_to`` ten times slower (elastic.md)."""
    _straggle(ctx, a, b, delay, slow)


@dtask.template("straggler_fixed", stealable=False, **_STRAGGLER)  # type: ignore[arg-type]
def straggler_fixed(ctx: dtask.ChildContext, a: int, b: int, delay: float, slow: list[int]) -> None:
    """``straggler`` whose children never give work away."""
    _straggle(ctx, a, b, delay, slow)


# children of ten numbers, ``slow`` = [first, last, seconds each] of the slow ones
_TENS: dict[str, Any] = dict(
    params={"n": int, "slow_from": int, "slow_to": int, "slow": float},
    skeleton={
        "start": 1,
        "end": "${n}",
        "slow": ["${slow_from}", "${slow_to}", "${slow}"],
    },
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("slow",)),
    checkpoint_interval=0.5,  # a checkpoint after each slow number, none in a fast child
)


@dtask.template("batched_straggler", **_TENS)
def batched_straggler(ctx: dtask.ChildContext, a: int, b: int, slow: list[float]) -> None:
    """Children of ten numbers done at once, short enough to go several to a message, but
    for the numbers ``slow[0]`` to ``slow[1]``, ``slow[2]`` seconds each; each number is
    written with the id of the Celery message that ran it (test_elastic.py)."""
    import time

    from celery import current_task

    message = current_task.request.id if current_task else "none"
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            if slow[0] <= i <= slow[1]:
                time.sleep(slow[2])
            out.write(f"{i} {message}\n")
            out.flush()


_appended: dict[Path, int] = {}  # a pool process's open files, for one write a child


def _append(path: Path, lines: list[str]) -> None:
    """``lines`` at the end of ``path`` in one write (O_APPEND: processes never interleave)."""
    fd = _appended.get(path)
    if fd is None:
        fd = _appended[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, "".join(lines).encode())


@dtask.template("message_straggler", **_TENS)
def message_straggler(ctx: dtask.ChildContext, a: int, b: int, slow: list[float]) -> None:
    """``batched_straggler`` short enough to go MAX_BATCH to a message: each child's numbers
    in one write to one file a run (``{run}.straggler``), a slow one as soon as it is done."""
    import time

    from celery import current_task

    message = current_task.request.id if current_task else "none"
    path = Path(os.environ["DTASK_TEST_SINK"]) / f"{ctx.run_id}.straggler"
    done = []
    for i in ctx.resume(range(a, b + 1)):
        if slow[0] <= i <= slow[1]:
            time.sleep(slow[2])
            _append(path, [f"{i} {message}\n"])
        else:
            done.append(f"{i} {message}\n")
    _append(path, done)


@dtask.template(
    "fails_how",
    params={"how": str},
    skeleton={"how": "${how}"},
    split=lambda r: [{"how": r["how"]}],
    max_attempts=3,
    dont_retry_on=KeyError,
)
def fails_how(ctx: dtask.ChildContext, how: str) -> object:
    """Fails per ``how``: "permanent" raises dtask.Permanent, "key" a KeyError (the template's
    dont_retry_on), "value" a ValueError (retried), "set" returns something not JSON."""
    with _sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt}\n")
    if how == "permanent":
        raise dtask.Permanent("the input file is malformed")
    if how == "key":
        raise KeyError("no customer 42")
    if how == "set":
        return {1, 2}
    raise ValueError("the service said 503")


@dtask.template(
    "chatty",
    stealable=False,
    params={"n": int, "lines": int, "every": float, "fail_first": int},
    skeleton={
        "start": 1,
        "end": "${n}",
        "lines": "${lines}",
        "every": "${every}",
        "fail_first": "${fail_first}",
    },
    split=dtask.RangeSplit("start", "end", chunk=1, carry=("lines", "every", "fail_first")),
    max_attempts=3,
)
def chatty(
    ctx: dtask.ChildContext, a: int, b: int, lines: int, every: float, fail_first: int
) -> int:
    """Prints ``lines`` numbered lines (one each ``every`` seconds) on stdout, one on stderr and
    one through ``ctx.log``; with ``fail_first``, its first attempt fails after printing."""
    import sys
    import time

    print(f"child {a} attempt {ctx.attempt} starts")
    print(f"child {a} attempt {ctx.attempt} on stderr", file=sys.stderr)
    ctx.log.warning("child %s attempt %s logs", a, ctx.attempt)
    for i in range(lines):
        print(f"line {i} of attempt {ctx.attempt}", flush=True)
        if every:
            time.sleep(every)
    if fail_first and ctx.attempt == 1:
        raise RuntimeError(f"attempt {ctx.attempt} of child {a} fails on purpose")
    print(f"child {a} attempt {ctx.attempt} ends")
    return a


@dtask.template(
    "per_customer",
    params={"customer": str, "n": int, "hold": str},
    skeleton={"start": 1, "end": "${n}", "hold": "${hold}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("hold",)),
    concurrency_key="export:${customer}",
    max_concurrent=1,
)
def per_customer(ctx: dtask.ChildContext, a: int, b: int, hold: str) -> None:
    """Runs of one customer one at a time; each child writes its numbers, then waits while
    DTASK_TEST_SINK/<hold> exists (an empty ``hold``: none)."""
    import time

    gate = Path(os.environ["DTASK_TEST_SINK"]) / hold if hold else None
    with _sink(ctx).open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            out.write(f"{i}\n")
    while gate is not None and gate.exists() and not ctx.should_stop():
        time.sleep(0.05)


def _async_sink(ctx: dtask.AsyncChildContext) -> Path:
    return Path(os.environ["DTASK_TEST_SINK"]) / f"{ctx.run_id}-{ctx.index}.txt"


@dtask.template(
    "async_range",
    stealable=False,  # its tests check each child's own numbers
    params={"n": int, "delay": float, "hold": str},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}", "hold": "${hold}"},
    split=dtask.RangeSplit("start", "end", chunk=20, carry=("delay", "hold")),
    checkpoint_every=5,
    checkpoint_interval=3600,
    reduce=sum,
)
async def async_range(ctx: dtask.AsyncChildContext, a: int, b: int, delay: float, hold: str) -> int:
    """held_range as an ``async def`` child: from its 6th item on it awaits while
    DTASK_TEST_SINK/<hold> exists, never asking ctx whether to stop (a hand-over cancels the
    await). Each attempt writes ``attempt N from DONE pid PID`` first; returns its sum."""
    import asyncio

    gate = Path(os.environ["DTASK_TEST_SINK"]) / hold
    done = (ctx.checkpoint_state or {"done": 0})["done"]
    total = 0
    with _async_sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt} from {done} pid {os.getpid()}\n")
        out.flush()
        async for i in ctx.resume(range(a, b + 1)):
            await asyncio.sleep(delay)
            out.write(f"{i}\n")
            out.flush()
            total += i
            while i - a >= 5 and gate.exists():
                await asyncio.sleep(0.05)
    return total + sum(range(a, a + done))


@dtask.template("async_hangs_capped", execution_cap=2, **_HANG)  # type: ignore[arg-type]
async def async_hangs_capped(
    ctx: dtask.AsyncChildContext, a: int, b: int, hang_at: int, how: str
) -> None:
    """An ``async def`` child that checkpoints each item with ``await ctx.checkpoint`` and,
    at ``hang_at``, awaits for an hour without asking ctx anything: its cap (2 s) cancels it."""
    import asyncio

    done = (ctx.checkpoint_state or {"done": 0})["done"]
    with _async_sink(ctx).open("a") as out:
        out.write(f"attempt {ctx.attempt} from {done} pid {os.getpid()}\n")
        out.flush()
        for i in range(a + done, b + 1):
            if i == hang_at:
                await asyncio.sleep(3600)
            out.write(f"{i}\n")
            out.flush()
            await ctx.checkpoint({"done": i - a + 1})
