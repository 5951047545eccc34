from django.urls import path

from webapp import api, gpus_api, health, tokens, views

urlpatterns = [
    path("", views.job_list, name="home"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new", views.job_new, name="job-new"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel", views.job_cancel, name="job-cancel"),
    path("account/tokens", tokens.token_list, name="token-list"),
    path("account/tokens/new", tokens.token_create, name="token-create"),
    path("account/tokens/<str:token_key>/revoke", tokens.token_revoke, name="token-revoke"),
    path("api/jobs", api.jobs, name="api-jobs"),
    path("api/jobs/<int:job_id>", api.job_detail, name="api-job"),
    path("api/jobs/<int:job_id>/cancel", api.job_cancel, name="api-job-cancel"),
    path("api/queues", api.queues, name="api-queues"),
    path("api/gpus", gpus_api.gpus, name="api-gpus"),
    path("healthz", health.healthz, name="healthz"),
]
