"""The admin's hosts and GPU workers: live or not, drained or not (by whom, when, why), with
actions to drain and resume them (the same services as the API, clockq/fleet/drains.py)."""

from __future__ import annotations

from django.contrib import admin, messages

from clockq.bus import heartbeat
from clockq.fleet import drains, registry
from clockq.fleet.models import GpuWorker, Host


class _Fleet(admin.ModelAdmin):
    """Rows the launchers write: shown and drained here, not edited."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def _act(modeladmin, request, queryset, act, verb: str) -> None:
    done = 0
    for row in queryset:
        try:
            act(row.name, actor=request.user.get_username())
            done += 1
        except drains.StillDrained as exc:
            modeladmin.message_user(request, str(exc), messages.WARNING)
    if done:
        modeladmin.message_user(request, f"{verb} {done}.", messages.SUCCESS)


@admin.action(description="Drain: take no job, running jobs checkpoint and go back to their queues")
def drain_hosts(modeladmin, request, queryset):
    _act(modeladmin, request, queryset, drains.drain_host, "Drained")


@admin.action(description="Resume: take jobs again")
def resume_hosts(modeladmin, request, queryset):
    _act(modeladmin, request, queryset, drains.resume_host, "Resumed")


@admin.action(description="Drain: take no job, the running job checkpoints and goes back to its queue")
def drain_workers(modeladmin, request, queryset):
    _act(modeladmin, request, queryset, drains.drain_worker, "Drained")


@admin.action(description="Resume: take jobs again")
def resume_workers(modeladmin, request, queryset):
    _act(modeladmin, request, queryset, drains.resume_worker, "Resumed")


def _beat(worker: GpuWorker) -> dict | None:
    try:
        return heartbeat.worker_info(worker.name)
    except Exception:  # the broker is down: shown as unknown
        return None


@admin.register(Host)
class HostAdmin(_Fleet):
    list_display = ["name", "roles", "is_live", "seen_at", "broker", "drained", "drained_by", "drained_at"]
    actions = [drain_hosts, resume_hosts]

    @admin.display(boolean=True, description="live")
    def is_live(self, host: Host) -> bool:
        return registry.is_live(host)

    @admin.display(boolean=True, description="drained")
    def drained(self, host: Host) -> bool:
        return host.drained


@admin.register(GpuWorker)
class GpuWorkerAdmin(_Fleet):
    list_display = ["name", "host", "gpu_index", "is_live", "taking_jobs", "drained", "drained_by", "drained_at"]
    list_select_related = ["host"]
    actions = [drain_workers, resume_workers]

    @admin.display(boolean=True, description="live")
    def is_live(self, worker: GpuWorker) -> bool | None:
        return _beat(worker) is not None

    @admin.display(boolean=True, description="taking jobs")
    def taking_jobs(self, worker: GpuWorker) -> bool | None:
        beat = _beat(worker)
        return None if beat is None else bool(beat.get("consuming", True))

    @admin.display(boolean=True, description="drained (itself or its host)")
    def drained(self, worker: GpuWorker) -> bool:
        return worker.drained or worker.host.drained

    @admin.display(description="drained by")
    def drained_by(self, worker: GpuWorker) -> str:
        row = worker if worker.drained else worker.host
        return row.drained_by if row.drained else ""

    @admin.display(description="drained at")
    def drained_at(self, worker: GpuWorker):
        row = worker if worker.drained else worker.host
        return row.drained_at if row.drained else None
