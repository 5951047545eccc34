"""The JSON API. Session, token or HTTP basic auth; see REST_FRAMEWORK in settings."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db.models import Count, Sum
from django.shortcuts import get_object_or_404
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.exceptions import ParseError
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response

from clockq.bus import free_gpus, heartbeat
from clockq.fleet import capacity, registry
from clockq.jobs import promotion, services
from clockq.jobs.models import Job, QueueTier
from clockq.policy.states import JobState
from clockq.policy.tiers import TIER_CODES
from webapp.access import visible_jobs
from webapp.forms import JobSubmitForm, binder
from webapp.serializers import (
    ErrorSerializer,
    EventSerializer,
    JobDetailSerializer,
    JobPageSerializer,
    JobSerializer,
    JobSubmitSerializer,
    QueuesSerializer,
    SliceSerializer,
)

SUBMIT_FIELDS = {"name", "tier", "workload", "params", "deadline", "gpu_mem_mib", "gpus"}

# The answers every API call may get, besides its own (for the OpenAPI schema, GET /api/schema).
COMMON_ERRORS = {
    401: OpenApiResponse(ErrorSerializer, description="No credentials, or a wrong or expired token."),
    429: OpenApiResponse(ErrorSerializer, description="Too many HTTP basic-auth attempts from this address."),
}
POST_ERRORS = {
    **COMMON_ERRORS,
    403: OpenApiResponse(ErrorSerializer, description="A browser session without its CSRF token."),
}
FIELD_ERRORS = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="Refused input: `detail` says why, or each field names its problems.",
)
# The route takes digits only (`<int:job_id>`); ids start at 1.
JOB_ID = OpenApiParameter(
    "job_id", {"type": "integer", "minimum": 1}, OpenApiParameter.PATH, description="The job's id."
)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such job, or not one of the caller's.")


class ApiTokenScheme(KnoxTokenScheme):
    """knox's token scheme, for its subclass webapp.auth.ApiTokenAuthentication."""

    target_class = "webapp.auth.ApiTokenAuthentication"


class OptionalBasicAuthScheme(OpenApiAuthenticationExtension):
    """Names webapp.auth.OptionalBasicAuthentication in the schema (drf-spectacular finds an
    extension by subclassing it; no registration needed), only where CLOCKQ_API_BASIC_AUTH is on:
    a client generated from the schema must not offer a login the server refuses. The schema is
    made at each GET /api/schema, so it follows the setting as the authentication does."""

    target_class = "webapp.auth.OptionalBasicAuthentication"

    @property  # type: ignore[override]
    def name(self) -> list[str]:  # a list of names, one per definition: none while it is off
        return ["basicAuth"] if settings.CLOCKQ_API_BASIC_AUTH else []

    def get_security_definition(self, auto_schema):
        if not settings.CLOCKQ_API_BASIC_AUTH:
            return []
        return [{"type": "http", "scheme": "basic", "description": "Throttled per address."}]

    def get_security_requirement(self, auto_schema):
        return {"basicAuth": []} if settings.CLOCKQ_API_BASIC_AUTH else None


# POST /api/jobs takes one job (an object) or a batch (a list of them), and answers in kind.
ONE_OR_BATCH = PolymorphicProxySerializer(
    component_name="JobSubmitOneOrBatch",
    serializers=[
        JobSubmitSerializer,
        PolymorphicProxySerializer(
            component_name="JobSubmit",
            serializers=JobSubmitSerializer.serializers,
            resource_type_field_name="workload",
            many=True,
        ),
    ],
    resource_type_field_name=None,
    many=False,
)
CREATED_ONE_OR_BATCH = PolymorphicProxySerializer(
    component_name="JobOneOrBatch",
    serializers=[JobSerializer, JobSerializer(many=True)],
    resource_type_field_name=None,
    many=False,
)
BATCH_ERRORS = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="Refused input: `detail` says why, or each field names its problems. For a batch, "
    "nothing is submitted and `errors` names each refused entry by its index: "
    '`{"detail": "...", "errors": {"3": {"tier": ["..."]}}}`.',
)
# The promote body: nothing, or the tier to promote to. Written out, so that the schema says what
# the view accepts (a closed object, a tier code or null) and no more.
PROMOTE_BODY = {
    "type": "object",
    "properties": {
        "tier": {
            "type": "string",
            "enum": list(TIER_CODES),
            "nullable": True,
            "description": "A more urgent tier than the job's own; default (absent or null): its tier's "
            "promote-to tier, else one rank up.",
        }
    },
    "additionalProperties": False,
}


@extend_schema(
    methods=["GET"],
    operation_id="jobs_list",
    summary="List the caller's jobs (every job for staff), newest first",
    parameters=[
        OpenApiParameter(
            "state",
            {"type": "array", "items": {"type": "string", "enum": [s.value for s in JobState]}},
            style="form",
            explode=False,
            description="Only jobs in this state, or in any of these (`queued,running,held`).",
        ),
        OpenApiParameter("tier", str, enum=list(TIER_CODES), description="Only jobs in this tier now."),
        OpenApiParameter("owner", str, description="Only this user's jobs (a username)."),
        OpenApiParameter("page", {"type": "integer", "minimum": 1}, description="Page number, from 1."),
    ],
    responses={
        200: JobPageSerializer,
        400: OpenApiResponse(OpenApiTypes.OBJECT, description="An unknown `state` or `tier`."),
        404: OpenApiResponse(ErrorSerializer, description="No such page."),
        **COMMON_ERRORS,
    },
)
@extend_schema(
    methods=["POST"],
    summary="Submit a job, or a batch of jobs",
    description="A JSON object submits one job, and the answer is that job. A JSON list of such "
    "objects (at least one, at most `CLOCKQ_API_MAX_BATCH`) submits them all or none: the answer is "
    'a list of the jobs in order, or a 400 naming each bad entry by its index (`{"errors": {"3": {...}}}`).',
    request=ONE_OR_BATCH,
    responses={
        201: CREATED_ONE_OR_BATCH,
        400: BATCH_ERRORS,
        413: OpenApiResponse(ErrorSerializer, description="The body is larger than the API accepts."),
        415: OpenApiResponse(ErrorSerializer, description="The body is not JSON."),
        **POST_ERRORS,
    },
)
@api_view(["GET", "POST"])
def jobs(request):
    if request.method == "POST":
        if isinstance(request.data, list):
            return _submit_batch(request)
        return _submit(request)
    queryset, errors = _filtered(visible_jobs(request.user).order_by("-id"), request.query_params)
    if errors:
        return Response(errors, status=400)
    paginator = PageNumberPagination()
    page = paginator.paginate_queryset(queryset, request)
    return paginator.get_paginated_response(JobSerializer(page, many=True, context={"request": request}).data)


def _filtered(queryset, query) -> tuple:
    """The jobs that `?state=`, `?tier=` and `?owner=` leave, or the errors naming a bad one."""
    errors = {}
    if states := query.get("state"):
        unknown = [s for s in states.split(",") if s not in JobState._value2member_map_]
        if unknown:
            errors["state"] = [f"unknown state {unknown[0][:20]!r}; the states are {', '.join(JobState)}"]
        queryset = queryset.filter(state__in=states.split(","))
    if tier := query.get("tier"):
        if tier not in TIER_CODES:
            errors["tier"] = [f"unknown tier {tier[:20]!r}; the tiers are {', '.join(TIER_CODES)}"]
        queryset = queryset.filter(tier__code=tier)
    if owner := query.get("owner"):
        if len(owner) > 150 or "\x00" in owner:  # no username is longer; PostgreSQL refuses a NUL
            errors["owner"] = ["not a username"]
        queryset = queryset.filter(owner__username=owner)
    return queryset, errors


def _submit(request):
    data = request.data
    if not isinstance(data, dict):
        raise ParseError("The body must be a JSON object.")
    errors, form = _validate(data, binder(_ApiSubmitForm, user=request.user))
    if errors is not None:
        return Response(errors, status=400)
    # A QuotaExceeded from here is answered 400 with its message (webapp/api_errors.py).
    job = services.submit_job(owner=request.user, **form.submission())
    return Response(JobSerializer(job, context={"request": request}).data, status=status.HTTP_201_CREATED)


class _ApiSubmitForm(JobSubmitForm):
    """The API checks each job's input with the form, but leaves the quota to
    services.submit_jobs, which checks it once per request, for a batch as a whole."""

    def quota_owner(self):
        return None


def _validate(data: dict, bind: Callable[[dict], JobSubmitForm]):
    """(errors, None) for refused input, else (None, the valid form). `bind` makes the form
    (forms.binder: one for a batch's entries)."""
    unknown = set(data) - SUBMIT_FIELDS
    if unknown:
        return {"detail": f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}"}, None
    wrong_type = {
        f: ["must be a string"]
        for f in ("name", "tier", "workload", "deadline")
        if data.get(f) is not None and not isinstance(data[f], str)
    }
    if wrong_type:
        return wrong_type, None
    form = bind(data)
    if not form.is_valid():
        return form.errors.get_json_data(), None
    return None, form


def _submit_batch(request):
    entries = request.data
    limit = settings.CLOCKQ_API_MAX_BATCH
    if not entries:
        return Response({"detail": "The batch is empty; send at least one job."}, status=400)
    if len(entries) > limit:
        return Response(
            {"detail": f"The batch has {len(entries)} jobs; at most {limit} are accepted at once."}, status=400
        )
    errors: dict[str, object] = {}
    submissions = []
    bind = binder(_ApiSubmitForm, user=request.user)
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            errors[str(index)] = {"detail": "must be a JSON object"}
            continue
        entry_errors, form = _validate(entry, bind)
        if entry_errors is not None:
            errors[str(index)] = entry_errors
        else:
            submissions.append(form.submission())
    if errors:
        return Response({"detail": "Nothing was submitted: some entries are refused.", "errors": errors}, status=400)
    created = services.submit_jobs(request.user, submissions)
    return Response(
        JobSerializer(created, many=True, context={"request": request}).data, status=status.HTTP_201_CREATED
    )


@extend_schema(
    summary="One job",
    parameters=[
        JOB_ID,
        OpenApiParameter(
            "history",
            str,
            description="Any non-empty value adds the job's `slice_history` and `events`, 500 of each at most.",
        ),
    ],
    responses={200: JobDetailSerializer, 404: NOT_FOUND, **COMMON_ERRORS},
)
@api_view(["GET"])
def job_detail(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    data = JobSerializer(job, context={"request": request}).data
    if request.query_params.get("history"):
        data["slice_history"] = SliceSerializer(job.slices.all()[:500], many=True).data
        data["events"] = EventSerializer(job.events.all()[:500], many=True).data
    return Response(data)


@extend_schema(
    operation_id="jobs_cancel",
    summary="Cancel a job",
    parameters=[JOB_ID],
    request=None,
    responses={
        200: JobSerializer,
        404: NOT_FOUND,
        409: OpenApiResponse(ErrorSerializer, description="The job has already ended."),
        **POST_ERRORS,
    },
)
@api_view(["POST"])
def job_cancel(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    try:
        job = services.cancel_job(job, actor=request.user.get_username())
    except services.ActionRefused as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(JobSerializer(job, context={"request": request}).data)


@extend_schema(
    operation_id="jobs_promote",
    summary="Promote a waiting job (staff)",
    description="The job is scheduled in a more urgent tier until it has had a fair amount of service there "
    "(the first rung of that tier's service ladder), then returns to its own, as a starved job "
    "does after `promote_after_rounds` skipped rounds. The history records who promoted it.",
    parameters=[JOB_ID],
    request={"application/json": PROMOTE_BODY},
    responses={
        200: JobSerializer,
        400: FIELD_ERRORS,
        403: OpenApiResponse(ErrorSerializer, description="Only staff may promote jobs."),
        404: NOT_FOUND,
        409: OpenApiResponse(ErrorSerializer, description="The job is not waiting, or already promoted."),
        **POST_ERRORS,
    },
)
@api_view(["POST"])
def job_promote(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    if not request.user.is_staff:
        return Response({"detail": "Only staff may promote jobs."}, status=status.HTTP_403_FORBIDDEN)
    data = request.data if request.data is not None else {}
    if not isinstance(data, dict) or set(data) - {"tier"}:
        return Response({"detail": 'The body must be empty or {"tier": "<code>"}.'}, status=400)
    tier = data.get("tier")
    if tier is not None and (not isinstance(tier, str) or tier not in TIER_CODES):
        return Response({"tier": [f"must be one of {', '.join(TIER_CODES)}"]}, status=400)
    try:
        job = promotion.promote_job(job, actor=request.user.get_username(), to_tier_code=tier)
    except services.ActionRefused as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(JobSerializer(job, context={"request": request}).data)


@extend_schema(
    summary="Jobs waiting, running and held in each tier, and the live workers",
    responses={200: QueuesSerializer, **COMMON_ERRORS},
)
@api_view(["GET"])
def queues(request):
    rows = (
        Job.objects.filter(state__in=[JobState.QUEUED, JobState.RUNNING, JobState.HELD])
        .values("tier__code", "state")
        .annotate(n=Count("id"), gpus=Sum("gpus"))
    )
    counts = {(row["tier__code"], row["state"]): row["n"] for row in rows}
    gpus = {(row["tier__code"], row["state"]): row["gpus"] for row in rows}
    tiers = [
        {
            "tier": t.code,
            "queue": t.queue_name,
            "rank": t.rank,
            "use": t.use,
            "waiting": counts.get((t.code, JobState.QUEUED), 0),
            "running": counts.get((t.code, JobState.RUNNING), 0),
            "held": counts.get((t.code, JobState.HELD), 0),
            "gpus_waiting": gpus.get((t.code, JobState.QUEUED), 0),  # the GPUs its waiting jobs ask for
            "gpus_running": gpus.get((t.code, JobState.RUNNING), 0),
            "wait_target_ms": t.wait_target_ms,
        }
        for t in QueueTier.objects.all()
    ]
    try:
        workers = heartbeat.live_workers()
        degraded = heartbeat.degraded_workers()
    except Exception:
        workers = None
    if workers is not None:
        drained = registry.drained_names(w["hostname"] for w in workers if heartbeat.on_a_gpu(w))
        for worker in workers:
            worker["degraded"] = degraded.get(worker.get("hostname"))
            worker["drained"] = drained.get(worker.get("hostname"))
        if not request.user.is_staff:
            workers = [_without_staff_fields(worker) for worker in workers]
    return Response({"tiers": tiers, "workers": workers, "gpus": _gpus_now(workers)})


def _gpus_now(workers: list[dict] | None) -> dict:
    """The cluster's GPUs against what the tiers ask for: registered, live (a GPU's main worker
    has a heartbeat) and free (clockq/bus/free_gpus.py's definition: live, taking jobs and
    running none). Live and free are null while the broker does not answer: the heartbeats are
    there."""
    found: dict[str, int | None] = {"registered": capacity.cluster_gpus(), "live": None, "free": None}
    if workers is not None:
        takers = free_gpus.idle_candidates(workers, besides="")
        running = Job.objects.filter(state=JobState.RUNNING, worker__in=takers).values_list("worker", flat=True)
        found.update(
            live=sum(1 for w in workers if w.get("gpu") is not None), free=len(free_gpus.free_of(takers, running))
        )
    return found


# What of a worker's heartbeat only staff see. A process id tells a user which process on the host
# to aim at (signals, /proc) and nothing they need to use the queue; host names stay public.
STAFF_ONLY_WORKER_FIELDS = frozenset({"pid"})


def _without_staff_fields(worker: dict) -> dict:
    return {key: value for key, value in worker.items() if key not in STAFF_ONLY_WORKER_FIELDS}
