"""GET /api/queues against a real GPU worker: what every logged-in user sees of the live workers,
and what only staff see."""

from __future__ import annotations

import pytest

from clockq.fleet import drains
from tests.harness import wait_for
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db(transaction=True)  # the worker process reads committed rows


def test_only_staff_see_the_process_ids_of_the_workers(client, start_workers, bob, carol):
    # Given one real GPU worker, announcing itself with its process id
    workers = start_workers(gpus=1)
    pids = set(workers.worker_pids())

    # When bob, who is not staff, and carol, who is, read the queues
    seen_by_bob = client.get("/api/queues", **token_auth(bob)).json()["workers"]
    seen_by_carol = client.get("/api/queues", **token_auth(carol)).json()["workers"]

    # Then both see the same workers by name and host, and only carol sees their process ids
    gpu_workers = [w for w in seen_by_bob if w.get("gpu") is not None]
    assert [w["hostname"] for w in gpu_workers] == [w["hostname"] for w in seen_by_carol if w.get("gpu") is not None]
    assert gpu_workers and all(w["host"] for w in gpu_workers)
    assert all("pid" not in w for w in seen_by_bob), seen_by_bob
    assert {w["pid"] for w in seen_by_carol if w.get("gpu") is not None} <= pids
    assert all(isinstance(w["pid"], int) for w in seen_by_carol)


def test_the_queues_say_the_gpus_live_and_free_against_the_gpus_the_tiers_ask_for(client, start_workers, bob):
    start_workers(gpus=1)
    seen = client.get("/api/queues", **token_auth(bob)).json()
    assert seen["gpus"] == {"registered": 1, "live": 1, "free": 1}  # an idle worker, nothing asked
    assert all(t["gpus_waiting"] == 0 and t["gpus_running"] == 0 for t in seen["tiers"])

    (worker,) = [w["hostname"] for w in seen["workers"] if w.get("gpu") is not None]
    drains.drain_worker(worker, actor="test")  # a drained GPU takes no job: live, not free
    # Free as the worker says it: once its heartbeat says it stopped taking jobs.
    wait_for(
        lambda: client.get("/api/queues", **token_auth(bob)).json()["gpus"] == {"registered": 1, "live": 1, "free": 0},
        30,
        "the drained worker's heartbeat to say it takes no jobs",
    )
