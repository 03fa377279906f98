"""The dtask side of one trivial child, in process and without Celery: claim, heartbeat
registration, context, finish. What the pool process pays on top of raw Celery per child.

    .venv/bin/python -m bench.child_path [--n 3000] [--batch K] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import sys
import time
from pathlib import Path

from bench import procs
from bench.cluster import prepare_environment


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--batch", type=int, default=1, help="children per message")
    args = parser.parse_args()
    prepare_environment()
    from dtask import services
    from dtask.domain.runs import NewRun
    from dtask.domain.templates import registry
    from dtask.services import embedded
    from dtask.worker import batch, configure, tasks

    configure()
    store = services.store()
    try:
        run_id, _ = store.runs.create(NewRun("bench_noop", "child-path", {"n": args.n}, 3, None))
        store.runs.split(run_id, lambda r, _: registry.get(r.template).plan(r.variables, args.n))
        # no broker: the task bodies are called; messages of several are taken as the
        # dispatcher takes them (a row each in dtask_messages, claimed as one)
        deferred = args.batch > 1
        store.runs.dispatch(run_id, lambda run, children: None, deferred=deferred)

        group = store.runs.get(run_id).group_id

        def take(indexes: range) -> list[list[list[object]]]:
            """The dispatcher's part (a main process's): not timed."""
            if args.batch == 1:
                return []
            with store.dispatch.turn(wait=10) as turn:
                assert turn is not None
                messages = turn.take(run_id, len(indexes), args.batch)
            return [[[c.index, c.spec] for c in message] for message in messages]

        def children(indexes: range, messages: list[list[list[object]]]) -> None:
            if args.batch == 1:
                for i in indexes:
                    tasks.child.run(run_id, i, "bench_noop", {"a": i + 1, "b": i + 1})
                return
            for items in messages:
                batch.children.run(run_id, "bench_noop", group, None, items)

        warm = args.n // 10
        children(range(warm), take(range(warm)))
        timed = range(warm, args.n)
        messages = take(timed)
        gc.freeze()  # as a worker does before it forks its pool (startup._freeze_heap)
        collected = {"s": 0.0, "n": 0, "at": 0.0}

        def timing(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                collected["at"] = time.perf_counter()
            else:
                collected["s"] += time.perf_counter() - collected["at"]
                collected["n"] += 1

        gc.callbacks.append(timing)
        profiler = cProfile.Profile() if args.profile else None
        before = procs.snapshot({})
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        children(timed, messages)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - start
        cpu = procs.cpu_by_role(before, procs.snapshot({}))
        per = {role: f"{1e6 * s / len(timed):.0f} us" for role, s in cpu.items()}
        gc.callbacks.remove(timing)
        print(
            f"{1e6 * seconds / len(timed):.0f} us wall per child; CPU per child: {per};"
            f" garbage collection {1e6 * collected['s'] / len(timed):.1f} us per child"
            f" ({collected['n']} passes)"
        )
        if profiler:
            if os.environ.get("BENCH_PROFILE_OUT"):
                profiler.dump_stats(os.environ["BENCH_PROFILE_OUT"])
            pstats.Stats(profiler).sort_stats(os.environ.get("BENCH_SORT", "cumulative")).print_stats(int(os.environ.get("BENCH_TOP", "25")))
    finally:
        embedded.stop(Path(os.environ["DTASK_HOME"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
