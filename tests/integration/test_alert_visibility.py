"""Which open alerts a token sees, against a real PostgreSQL: an admin every one; a client's
token those about its own runs and the cluster's (workers), never another client's run nor a
schedule (schedules belong to no client)."""

from __future__ import annotations

import uuid

from dtask import services
from dtask.client.clients import set_client
from dtask.domain.alerts import SCOPES, Alert, AlertKind
from dtask.domain.runs import NewRun


def test_a_client_sees_its_own_runs_alerts_and_the_cluster_s_only(
    dtask_env: dict[str, str],
) -> None:
    store = services.store()
    a, b = f"va{uuid.uuid4().hex[:8]}", f"vb{uuid.uuid4().hex[:8]}"
    set_client(a)
    set_client(b)
    run_a, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None, client=a))
    run_b, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None, client=b))
    holding = [
        Alert(AlertKind.RUN_STALLED, str(run_a), f"run {run_a} (t) has made no progress"),
        Alert(AlertKind.RUN_LATE, str(run_b), f"run {run_b} (t) has not started"),
        Alert(AlertKind.WORKER_LOST, "gone@test", "worker gone@test stopped reporting"),
        Alert(AlertKind.SCHEDULE_MISFIRED, "nightly", "schedule nightly: 3 slots missed"),
    ]
    assert store.alerts.sync(holding) is not None
    try:

        def seen(client: str | None) -> set[tuple[str, str]]:
            return {(x.kind, x.subject) for x in store.alerts.open(client)}

        every = {(x.kind.value, x.subject) for x in holding}
        assert seen(None) == every  # an admin's view
        assert seen(a) == {("run_stalled", str(run_a)), ("worker_lost", "gone@test")}
        assert seen(b) == {("run_late", str(run_b)), ("worker_lost", "gone@test")}
        assert seen(f"nobody{uuid.uuid4().hex[:6]}") == {("worker_lost", "gone@test")}
        assert set(SCOPES) == set(AlertKind)  # a new kind must say who sees it
    finally:
        store.alerts.sync([])
        store.runs.cancel(run_a)
        store.runs.cancel(run_b)
