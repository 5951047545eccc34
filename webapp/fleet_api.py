"""Hosts and GPU workers: list them, and drain or resume one GPU or a whole host for
maintenance (clockq/fleet/drains.py). Reading is for any logged-in user, as /api/queues is;
draining and resuming are for staff.

A drain is done when the answer's `running_jobs` is empty: each job that ran there has
checkpointed and gone back to its queue, for a GPU that is not drained."""

from __future__ import annotations

import re

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view
from rest_framework.response import Response

from clockq.fleet import drains
from clockq.fleet import status as fleet_status
from clockq.fleet.models import GpuWorker, Host
from webapp.api import COMMON_ERRORS, POST_ERRORS
from webapp.serializers import ErrorSerializer

_WORKER = re.compile(r"[A-Za-z0-9_.-]{1,64}@[A-Za-z0-9._-]{1,63}")
_HOST = re.compile(r"[A-Za-z0-9._-]{1,63}")


class DrainFieldsMixin(serializers.Serializer):
    drained = serializers.BooleanField(help_text="Takes no job until resumed.")
    drained_by = serializers.CharField(allow_null=True)
    drained_at = serializers.DateTimeField(allow_null=True)
    drain_reason = serializers.CharField(allow_null=True)


class RtLaneSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="rt<N>@<host>")
    consuming = serializers.BooleanField(allow_null=True, help_text="Takes RT jobs now; not while its GPU is drained.")
    running_jobs = serializers.ListField(child=serializers.IntegerField(), help_text="The RT job it runs, if any.")


class WorkerStatusSerializer(DrainFieldsMixin):
    name = serializers.CharField(help_text="gpu<N>@<host>")
    host = serializers.CharField()
    gpu = serializers.IntegerField()
    live = serializers.BooleanField(allow_null=True, help_text="Its heartbeat is fresh; null: the broker is down.")
    consuming = serializers.BooleanField(
        allow_null=True, help_text="It takes jobs from the tier queues now; null when it is not live."
    )
    drained_with_host = serializers.BooleanField(help_text="Drained because its host is.")
    running_jobs = serializers.ListField(child=serializers.IntegerField(), help_text="Ids of the jobs running on it.")
    rt_lane = RtLaneSerializer(
        allow_null=True, help_text="The GPU's standby RT lane (CLOCKQ_RT_LANE), drained with it; null: none live."
    )


class HostStatusSerializer(DrainFieldsMixin):
    name = serializers.CharField()
    roles = serializers.ListField(child=serializers.CharField())
    live = serializers.BooleanField(help_text="Its launcher was seen in the last 45 s.")
    seen_at = serializers.DateTimeField(allow_null=True)
    broker = serializers.CharField(help_text="The broker it uses, host:port.")
    workers = WorkerStatusSerializer(many=True)
    running_jobs = serializers.ListField(child=serializers.IntegerField())


class HostsSerializer(serializers.Serializer):
    hosts = HostStatusSerializer(many=True)


class DrainSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=drains.MAX_REASON)


WORKER = OpenApiParameter(
    "name",
    {"type": "string", "pattern": f"^{_WORKER.pattern}$"},
    OpenApiParameter.PATH,
    description="The worker's name, gpu<N>@<host>.",
)
HOST = OpenApiParameter(
    "host",
    {"type": "string", "pattern": f"^{_HOST.pattern}$"},
    OpenApiParameter.PATH,
    description="The host's name (its CLOCKQ_HOST).",
)
NO_WORKER = OpenApiResponse(ErrorSerializer, description="No GPU worker of that name was ever registered.")
NO_HOST = OpenApiResponse(ErrorSerializer, description="No host of that name was ever registered.")
STAFF_ONLY = OpenApiResponse(ErrorSerializer, description="Only staff may drain and resume.")


def _staff_only(request) -> Response | None:
    if not request.user.is_staff:
        return Response({"detail": "Only staff may drain and resume."}, status=status.HTTP_403_FORBIDDEN)
    return None


def _reason(request) -> tuple[str, Response | None]:
    data = request.data if request.data is not None else {}
    if not isinstance(data, dict):
        return "", Response({"detail": 'The body must be empty or {"reason": "..."}.'}, status=400)
    if unknown := sorted(set(data) - {"reason"}):
        return "", Response({"detail": f"Unknown field(s): {', '.join(unknown)}."}, status=400)
    if not isinstance(data.get("reason", ""), str):
        return "", Response({"reason": ["must be a string"]}, status=400)
    body = DrainSerializer(data=data)
    if not body.is_valid():
        return "", Response(body.errors, status=400)
    return body.validated_data.get("reason", ""), None


def _no_worker(name: str) -> Response:
    return Response({"detail": f"No GPU worker {name!r} was ever registered."}, status=404)


def _no_host(name: str) -> Response:
    return Response({"detail": f"No host {name!r} was ever registered."}, status=404)


@extend_schema(
    operation_id="hosts_list",
    summary="Every host, its roles and GPU workers, and their drains",
    responses={200: HostsSerializer, **COMMON_ERRORS},
)
@api_view(["GET"])
def hosts(request):
    return Response({"hosts": fleet_status.all_hosts()})


@extend_schema(
    operation_id="hosts_retrieve",
    summary="One host",
    parameters=[HOST],
    responses={200: HostStatusSerializer, 404: NO_HOST, **COMMON_ERRORS},
)
@api_view(["GET"])
def host_detail(request, host: str):
    if not _HOST.fullmatch(host):
        return _no_host(host)
    try:
        return Response(fleet_status.one_host(host))
    except Host.DoesNotExist:
        return _no_host(host)


@extend_schema(
    summary="Drain a host (staff)",
    description="Its GPU workers stop taking jobs (those it starts later too), and each running job checkpoints "
    "at its next step and goes back to its queue. Done when `running_jobs` is empty. Draining a drained host "
    "keeps its first drain and asks any job still running there to leave again.",
    parameters=[HOST],
    request=DrainSerializer,
    responses={200: HostStatusSerializer, 400: ErrorSerializer, 403: STAFF_ONLY, 404: NO_HOST, **POST_ERRORS},
)
@api_view(["POST"])
def host_drain(request, host: str):
    if refused := _staff_only(request):
        return refused
    reason, bad = _reason(request)
    if bad:
        return bad
    if not _HOST.fullmatch(host):
        return _no_host(host)
    try:
        drains.drain_host(host, actor=request.user.get_username(), reason=reason)
    except Host.DoesNotExist:
        return _no_host(host)
    return Response(fleet_status.one_host(host))


@extend_schema(
    summary="Resume a drained host (staff)",
    description="Its GPU workers take jobs again, but for any GPU drained on its own.",
    parameters=[HOST],
    request=None,
    responses={200: HostStatusSerializer, 403: STAFF_ONLY, 404: NO_HOST, **POST_ERRORS},
)
@api_view(["POST"])
def host_resume(request, host: str):
    if refused := _staff_only(request):
        return refused
    if not _HOST.fullmatch(host):
        return _no_host(host)
    try:
        drains.resume_host(host, actor=request.user.get_username())
    except Host.DoesNotExist:
        return _no_host(host)
    return Response(fleet_status.one_host(host))


@extend_schema(
    summary="One GPU worker",
    parameters=[WORKER],
    responses={200: WorkerStatusSerializer, 404: NO_WORKER, **COMMON_ERRORS},
)
@api_view(["GET"])
def worker_detail(request, name: str):
    if not _WORKER.fullmatch(name):
        return _no_worker(name)
    try:
        return Response(fleet_status.one_worker(name))
    except GpuWorker.DoesNotExist:
        return _no_worker(name)


@extend_schema(
    summary="Drain a GPU worker (staff)",
    description="It stops taking jobs, and its running job checkpoints at its next step and goes back to its "
    "queue. Done when `running_jobs` is empty.",
    parameters=[WORKER],
    request=DrainSerializer,
    responses={200: WorkerStatusSerializer, 400: ErrorSerializer, 403: STAFF_ONLY, 404: NO_WORKER, **POST_ERRORS},
)
@api_view(["POST"])
def worker_drain(request, name: str):
    if refused := _staff_only(request):
        return refused
    reason, bad = _reason(request)
    if bad:
        return bad
    if not _WORKER.fullmatch(name):
        return _no_worker(name)
    try:
        drains.drain_worker(name, actor=request.user.get_username(), reason=reason)
    except GpuWorker.DoesNotExist:
        return _no_worker(name)
    return Response(fleet_status.one_worker(name))


@extend_schema(
    summary="Resume a drained GPU worker (staff)",
    parameters=[WORKER],
    request=None,
    responses={
        200: WorkerStatusSerializer,
        403: STAFF_ONLY,
        404: NO_WORKER,
        409: OpenApiResponse(ErrorSerializer, description="Its host is drained: resume the host."),
        **POST_ERRORS,
    },
)
@api_view(["POST"])
def worker_resume(request, name: str):
    if refused := _staff_only(request):
        return refused
    if not _WORKER.fullmatch(name):
        return _no_worker(name)
    try:
        drains.resume_worker(name, actor=request.user.get_username())
    except GpuWorker.DoesNotExist:
        return _no_worker(name)
    except drains.StillDrained as exc:
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return Response(fleet_status.one_worker(name))
