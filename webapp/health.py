"""/healthz: 200 once the system can run jobs (database, broker and a GPU worker that is neither
degraded nor drained), else 503.

Anyone may ask, and gets the status alone: the detail (worker names, the checkpoint folder's
path, errors) is for staff sessions and for monitoring with the metrics token
(`Authorization: Bearer <CLOCKQ_METRICS_TOKEN>`), as /metrics is.

The load forecast's freshness is shown too (`forecast`: ok, waiting for the first one, or
stale when older than 5 minutes; clockq.forecasting.forecasts.forecast_health). A stale forecast is
not a reason for 503: jobs still run, only the control state stops following the load."""

from __future__ import annotations

import shutil

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from clockq.bus import gpu_samples, heartbeat
from clockq.bus.client import client, ping
from clockq.fleet import registry
from clockq.forecasting import forecasts
from clockq.jobs.models import Job
from clockq.jobs.quotas import KEPT_GENERATIONS
from webapp.metrics import bears_metrics_token


@require_GET
def healthz(request):
    checks: dict[str, dict] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": str(exc)[:200]}
    checks["broker"] = {"ok": ping()}
    gpu_workers: list[str] = []
    degraded: dict[str, str] = {}
    drained: dict[str, str] = {}
    if checks["broker"]["ok"]:
        try:
            gpu_workers = [w["hostname"] for w in heartbeat.live_workers() if w.get("gpu") is not None]
            degraded = heartbeat.degraded_workers()
        except Exception as exc:
            checks["broker"] = {"ok": False, "error": str(exc)[:200]}
    if checks["database"]["ok"] and gpu_workers:
        drained = registry.drained_names(gpu_workers)
    # Degraded workers (their checkpoint storage fails) are alive but cannot keep work, and
    # drained ones take none: the system can run jobs only while a GPU worker is neither.
    healthy = [w for w in gpu_workers if w not in degraded and w not in drained]
    checks["workers"] = {"ok": bool(healthy), "gpu_workers": gpu_workers, "degraded": degraded, "drained": drained}
    ok = all(c["ok"] for c in checks.values())
    status = 200 if ok else 503
    if not (request.user.is_staff or bears_metrics_token(request)):
        return JsonResponse({"status": "ok" if ok else "unavailable"}, status=status)
    body = {
        "status": "ok" if ok else "unavailable",
        "checks": checks,
        "gpu_errors": _gpu_errors(checks),
        "checkpoints": _checkpoint_storage(checks),
        "forecast": _forecast(checks),
    }
    return JsonResponse(body, status=status)


def _checkpoint_storage(checks: dict) -> dict:
    """The checkpoint folder's disk as this host sees it (with many hosts it is shared storage),
    and what clockq's jobs hold on it. Shown, not a reason for 503: a full disk degrades the
    workers, which say so above."""
    info: dict = {"path": str(settings.CLOCKQ_CHECKPOINT_DIR)}
    try:
        usage = shutil.disk_usage(settings.CLOCKQ_CHECKPOINT_DIR)
        info.update(total_bytes=usage.total, free_bytes=usage.free, used_fraction=round(usage.used / usage.total, 4))
    except OSError as exc:
        info["error"] = f"not readable from this host: {exc.strerror or exc}"
    if checks["database"]["ok"]:
        total = Job.objects.aggregate(total=Sum("checkpoint_bytes"))["total"] or 0
        info["held_by_jobs_bytes"] = KEPT_GENERATIONS * total
    return info


def _forecast(checks: dict) -> dict:
    if not checks["database"]["ok"]:
        return {"ok": False, "status": "unknown", "age_s": None}
    return forecasts.forecast_health()


def _gpu_errors(checks: dict) -> dict[str, str]:
    """NVML errors that GPU workers reported with their latest samples (a GPU off the bus, a
    driver mismatch). Shown here, but not a reason for 503: the other GPUs still run jobs."""
    if not checks["broker"]["ok"]:
        return {}
    try:
        samples = gpu_samples.cluster_samples(client())
    except Exception:
        return {}
    return {f"gpu{s.gpu_index}@{s.host}": s.error for s in samples if s.error}
