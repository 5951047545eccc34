"""/healthz: 200 once the system can run jobs (database, broker and a GPU worker), else 503."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from clockq.bus import gpu_samples, heartbeat
from clockq.bus.client import client, ping


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
    if checks["broker"]["ok"]:
        try:
            gpu_workers = [w["hostname"] for w in heartbeat.live_workers() if w.get("gpu") is not None]
            degraded = heartbeat.degraded_workers()
        except Exception as exc:
            checks["broker"] = {"ok": False, "error": str(exc)[:200]}
    # Degraded workers (their checkpoint storage fails) are alive but cannot keep work: the
    # system can run jobs only while at least one GPU worker is not degraded.
    healthy = [w for w in gpu_workers if w not in degraded]
    checks["workers"] = {"ok": bool(healthy), "gpu_workers": gpu_workers, "degraded": degraded}
    ok = all(c["ok"] for c in checks.values())
    body = {"status": "ok" if ok else "unavailable", "checks": checks, "gpu_errors": _gpu_errors(checks)}
    return JsonResponse(body, status=200 if ok else 503)


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
