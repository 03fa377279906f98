"""A worker's memory does not grow with the children it has run: the real child task, run
in-process against the real PostgreSQL, allocates nothing that outlives the child (it once kept
a logger per child: 575 bytes each, for ever)."""

from __future__ import annotations

import gc
import logging
import resource
import tracemalloc
from collections.abc import Iterator

import pytest

from dtask import services
from dtask.db import Store
from dtask.domain.runs import NewRun
from dtask.worker import configure
from dtask.worker.tasks import child

WARM_UP, MEASURED, LIFETIME = 1_000, 3_000, 100_000


@pytest.fixture
def quiet() -> Iterator[None]:
    """No INFO records: pytest's log capture keeps every record it sees."""
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def run_of(store: Store, children: int) -> int:
    run_id, _ = store.runs.create(NewRun("logs", "memory", {"n": children}, 1, None))
    store.runs.split(run_id, lambda run, slots: [{"a": i, "b": i} for i in range(children)])
    store.runs.dispatch(run_id, lambda run, kids: None)  # sent by hand below, one by one
    return run_id


def test_a_worker_that_ran_100k_children_holds_no_more_than_one_that_ran_1k(
    dtask_env: dict[str, str], quiet: None
) -> None:
    configure()
    store = services.store()
    run_id = run_of(store, WARM_UP + MEASURED)

    def run(indexes: range) -> None:
        for i in indexes:
            child.apply(args=(run_id, i, "logs", {"a": i, "b": i}), throw=True)

    run(range(WARM_UP))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(range(WARM_UP, WARM_UP + MEASURED))
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert store.runs.get(run_id).state.value == "succeeded"
    per_child = max(0, after - before) / MEASURED
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    grown = per_child * (LIFETIME - WARM_UP)
    print(f"\n{per_child:.1f} bytes kept per child: {grown / 2**20:.2f} MiB over 100,000"
          f" children, against {rss / 2**20:.0f} MiB resident")  # fmt: skip
    assert grown < 0.10 * rss, f"{per_child:.0f} bytes per child stay allocated"
