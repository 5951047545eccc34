from django.http import JsonResponse
from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from webapp import api, dashboard, fleet_api, gpus_api, health, kpis_api, results_api, tokens, views
from webapp.metrics import metrics


@csrf_exempt  # it changes nothing; a POST gets the same 404, not the CSRF failure page
def api_not_found(request):
    """Any other /api/ URL, `/api/jobs/abc` say: a JSON 404 like the API's own, not Django's
    HTML page (found by the fuzz test, tests/webapp/test_api_fuzz.py)."""
    return JsonResponse({"detail": "Not found."}, status=404)


urlpatterns = [
    path("", views.job_list, name="home"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel", views.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/result/<str:name>", views.job_result_file, name="job-result-file"),
    path("dashboard", dashboard.dashboard, name="dashboard"),
    path("dashboard/data", dashboard.dashboard_data, name="dashboard-data"),
    path("account/tokens", tokens.token_list, name="token-list"),
    path("account/tokens/new", tokens.token_create, name="token-create"),
    path("account/tokens/<str:token_key>/revoke", tokens.token_revoke, name="token-revoke"),
    path("account/tokens/<str:token_key>/rotate", tokens.token_rotate, name="token-rotate"),
    path("api/jobs", api.jobs, name="api-jobs"),
    path("api/jobs/<int:job_id>", api.job_detail, name="api-job"),
    path("api/jobs/<int:job_id>/cancel", api.job_cancel, name="api-job-cancel"),
    path("api/jobs/<int:job_id>/promote", api.job_promote, name="api-job-promote"),
    path("api/jobs/<int:job_id>/result", results_api.job_result, name="api-job-result"),
    path("api/jobs/<int:job_id>/metrics", results_api.job_metrics_view, name="api-job-metrics"),
    path("api/jobs/<int:job_id>/result/<str:name>", results_api.job_result_file, name="api-job-result-file"),
    path("api/queues", api.queues, name="api-queues"),
    path("api/gpus", gpus_api.gpus, name="api-gpus"),
    path("api/kpis", kpis_api.kpis, name="api-kpis"),
    path("api/hosts", fleet_api.hosts, name="api-hosts"),
    path("api/hosts/<str:host>", fleet_api.host_detail, name="api-host"),
    path("api/hosts/<str:host>/drain", fleet_api.host_drain, name="api-host-drain"),
    path("api/hosts/<str:host>/resume", fleet_api.host_resume, name="api-host-resume"),
    path("api/workers/<str:name>", fleet_api.worker_detail, name="api-worker"),
    path("api/workers/<str:name>/drain", fleet_api.worker_drain, name="api-worker-drain"),
    path("api/workers/<str:name>/resume", fleet_api.worker_resume, name="api-worker-resume"),
    # The OpenAPI schema is public, so that clients can discover the API: it describes the
    # endpoints and bodies and holds no secrets (no data, no tokens). Without authentication
    # classes a stale token sent along does not turn it into a 401. YAML by default; JSON with
    # `Accept: application/vnd.oai.openapi+json` or `?format=json`.
    path(
        "api/schema",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
        name="api-schema",
    ),
    re_path(r"^api/", api_not_found),  # last of the /api/ routes
    path("healthz", health.healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),  # Prometheus; a bearer token or staff (webapp/metrics.py)
]
