"""Hosts and GPU workers as the API and the admin show them: registered, live (heartbeats),
drained, taking jobs, and the jobs running on them."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from clockq.bus import heartbeat, lanes
from clockq.fleet.models import Drainable, GpuWorker, Host
from clockq.fleet.registry import host_of, is_live
from clockq.jobs.models import Job
from clockq.policy.states import JobState

log = logging.getLogger("clockq.fleet")


def live_heartbeats() -> dict[str, dict[str, Any]] | None:
    """Worker name -> its heartbeat, for every live worker; None when the broker does not answer."""
    try:
        return {w["hostname"]: w for w in heartbeat.live_workers() if w.get("hostname")}
    except Exception as exc:
        log.warning("cannot read the workers' heartbeats: %s", exc)
        return None


def _running(worker_filter: dict[str, Any]) -> dict[str, list[int]]:
    jobs: dict[str, list[int]] = defaultdict(list)
    for job_id, worker in (
        Job.objects.filter(state=JobState.RUNNING, **worker_filter).order_by("id").values_list("id", "worker")
    ):
        jobs[worker].append(job_id)
    return jobs


def _drain_fields(row: Drainable | None) -> dict[str, Any]:
    if row is None or not row.drained:
        return {"drained_by": None, "drained_at": None, "drain_reason": None}
    return {"drained_by": row.drained_by, "drained_at": row.drained_at, "drain_reason": row.drain_reason}


def worker_status(
    worker: GpuWorker, host: Host, beats: dict[str, dict] | None, running: dict[str, list[int]]
) -> dict[str, Any]:
    beat = (beats or {}).get(worker.name)
    drained_by = worker if worker.drained else host if host.drained else None
    return {
        "name": worker.name,
        "host": host.name,
        "gpu": worker.gpu_index,
        "live": None if beats is None else beat is not None,
        # Whether it pops jobs from the tier queues now (a drained worker stops within seconds).
        "consuming": beat.get("consuming") if beat is not None else None,
        "drained": drained_by is not None,
        "drained_with_host": drained_by is host,
        **_drain_fields(drained_by),
        "running_jobs": running.get(worker.name, []),
        "rt_lane": _lane_status(worker.name, beats, running),
    }


def _lane_status(main: str, beats: dict[str, dict] | None, running: dict[str, list[int]]) -> dict[str, Any] | None:
    """The GPU's standby RT lane (workers/rt_lane.py), drained with it; None while none is live."""
    name = lanes.lane_name(main)
    beat = (beats or {}).get(name)
    if beat is None:
        return None
    return {"name": name, "consuming": beat.get("consuming"), "running_jobs": running.get(name, [])}


def host_status(host: Host, beats: dict[str, dict] | None) -> dict[str, Any]:
    running = _running({"worker__endswith": f"@{host.name}"})
    workers = {w.name: w for w in host.gpu_workers.all()}
    for name, beat in sorted((beats or {}).items()):
        if host_of(name) == host.name and name not in workers and beat.get("gpu") is not None:
            # Live, but not registered (started by hand, or by an older launcher).
            workers[name] = GpuWorker(name=name, host=host, gpu_index=int(beat["gpu"]))
    return {
        "name": host.name,
        "roles": host.roles,
        "live": is_live(host),
        "seen_at": host.seen_at,
        "broker": host.broker,
        "drained": host.drained,
        **_drain_fields(host),
        "workers": [worker_status(w, host, beats, running) for w in workers.values()],
        "running_jobs": sorted(job for jobs in running.values() for job in jobs),
    }


def all_hosts() -> list[dict[str, Any]]:
    beats = live_heartbeats()
    return [host_status(h, beats) for h in Host.objects.prefetch_related("gpu_workers")]


def one_host(name: str) -> dict[str, Any]:
    """Host.DoesNotExist when no launcher ever registered it."""
    return host_status(Host.objects.get(name=name), live_heartbeats())


def one_worker(name: str) -> dict[str, Any]:
    """GpuWorker.DoesNotExist when the name was never registered."""
    worker = GpuWorker.objects.select_related("host").get(name=name)
    running = _running({"worker__in": [name, lanes.lane_name(name)]})
    return worker_status(worker, worker.host, live_heartbeats(), running)
