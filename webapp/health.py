"""/healthz: 200 once the system can run jobs (database, broker and a GPU worker), else 503."""

from __future__ import annotations

from django.db import connection
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from workers import broker, heartbeat


@require_GET
def healthz(request):
    checks: dict[str, dict] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": str(exc)[:200]}
    checks["broker"] = {"ok": broker.ping()}
    gpu_workers = []
    if checks["broker"]["ok"]:
        try:
            gpu_workers = [w["hostname"] for w in heartbeat.live_workers() if w.get("gpu") is not None]
        except Exception as exc:
            checks["broker"] = {"ok": False, "error": str(exc)[:200]}
    checks["workers"] = {"ok": bool(gpu_workers), "gpu_workers": gpu_workers}
    ok = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503)
