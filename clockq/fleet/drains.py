"""Drain and resume a GPU worker or a whole host, for maintenance.

A drain is recorded in the database first (it survives restarts: a drained worker that starts
again stays drained). Then the drained workers are asked to stop taking jobs (Celery's remote
control, clockq/bus/consumers.py), and only then are their running jobs asked to leave: each
checkpoints at its next step and goes back to its queue (the operator's requeue), where a GPU
that is not drained takes it. In that order, a worker never takes back the job it just left.
Resume clears the drain and the workers take jobs again."""

from __future__ import annotations

import contextlib
import logging

from django.db import transaction
from django.utils import timezone

from clockq.bus import consumers, heartbeat, lanes, signals
from clockq.bus.client import client
from clockq.fleet.models import GpuWorker, Host
from clockq.jobs import services
from clockq.jobs.models import Job
from clockq.policy.states import JobState

log = logging.getLogger("clockq.fleet")

MAX_REASON = 300


class StillDrained(Exception):
    """A worker cannot be resumed while its host is drained."""


def drain_worker(name: str, *, actor: str, reason: str = "") -> GpuWorker:
    """Drain one GPU worker (GpuWorker.DoesNotExist if the name was never registered). Draining
    a drained worker changes nothing but asks its running job, if any, to leave again."""
    GpuWorker.objects.get(name=name)
    GpuWorker.objects.filter(name=name, drained_at__isnull=True).update(
        drained_at=timezone.now(), drained_by=actor[:150], drain_reason=reason[:MAX_REASON]
    )
    with_lane = [name, lanes.lane_name(name)]  # its RT lane is drained with it
    _after_commit(lambda: _apply(worker_names=with_lane, running=_running_on(with_lane), actor=actor, what=name))
    return GpuWorker.objects.select_related("host").get(name=name)


def resume_worker(name: str, *, actor: str) -> GpuWorker:
    """Undo drain_worker. StillDrained while its host is drained: resume the host."""
    worker = GpuWorker.objects.select_related("host").get(name=name)
    if worker.host.drained:
        raise StillDrained(f"{name}'s host {worker.host.name} is drained: resume the host")
    GpuWorker.objects.filter(name=name).update(drained_at=None, drained_by="", drain_reason="")
    log.info("%s resumed by %s", name, actor)
    _after_commit(lambda: _apply(worker_names=[name, lanes.lane_name(name)], running=[], actor=actor, what=name))
    return GpuWorker.objects.select_related("host").get(name=name)


def drain_host(name: str, *, actor: str, reason: str = "") -> Host:
    """Drain every GPU worker of a host, those it starts later included (Host.DoesNotExist if
    no launcher ever registered it)."""
    Host.objects.get(name=name)
    Host.objects.filter(name=name, drained_at__isnull=True).update(
        drained_at=timezone.now(), drained_by=actor[:150], drain_reason=reason[:MAX_REASON]
    )
    _after_commit(
        lambda: _apply(
            worker_names=workers_of(name),
            running=list(Job.objects.filter(state=JobState.RUNNING, worker__endswith=f"@{name}")),
            actor=actor,
            what=f"host {name}",
        )
    )
    return Host.objects.get(name=name)


def resume_host(name: str, *, actor: str) -> Host:
    """Undo drain_host. A GPU of it drained on its own stays drained."""
    Host.objects.get(name=name)
    Host.objects.filter(name=name).update(drained_at=None, drained_by="", drain_reason="")
    log.info("host %s resumed by %s", name, actor)
    _after_commit(lambda: _apply(worker_names=workers_of(name), running=[], actor=actor, what=f"host {name}"))
    return Host.objects.get(name=name)


def workers_of(host: str) -> list[str]:
    """The GPU workers of `host` and their RT lanes: those registered, and any live one not
    registered."""
    registered = list(GpuWorker.objects.filter(host__name=host).values_list("name", flat=True))
    names = {*registered, *(lanes.lane_name(n) for n in registered)}
    try:
        names |= {
            w["hostname"]
            for w in heartbeat.live_workers()
            if heartbeat.on_a_gpu(w) and str(w.get("hostname", "")).endswith(f"@{host}")
        }
    except Exception as exc:  # the broker is down; the registered names are enough
        log.warning("cannot list the live workers of %s: %s", host, exc)
    return sorted(names)


def _running_on(worker_names: list[str]) -> list[Job]:
    return list(Job.objects.filter(state=JobState.RUNNING, worker__in=worker_names))


def _apply(*, worker_names: list[str], running: list[Job], actor: str, what: str) -> None:
    """Make the workers apply their drain, then ask their running jobs to leave. The pool
    processes hear first (pub/sub, at once), so that one about to claim reads its drain again;
    then the main processes stop or start consuming."""
    try:
        signals.announce_fleet_changed(client())
    except Exception as exc:
        log.warning("could not announce the drain of %s: %s", what, exc)
    live = _live(worker_names)
    answered = consumers.sync_drain(live)
    if missing := sorted(set(live) - set(answered)):
        log.warning("%s did not answer at once; each applies its drain at its next heartbeat", ", ".join(missing))
    for job in running:
        # It ended meanwhile, or an operator's action is pending: it leaves anyway.
        with contextlib.suppress(services.ActionRefused):
            services.requeue_job(job, actor, why=f"{what} drained by {actor}")
    if running:
        log.info("%s drained by %s: %d running job(s) asked to leave", what, actor, len(running))


def _live(worker_names: list[str]) -> list[str]:
    try:
        alive = {w.get("hostname") for w in heartbeat.live_workers()}
    except Exception:
        return []
    return [name for name in worker_names if name in alive]


def _after_commit(effects) -> None:
    transaction.on_commit(effects)
