"""What a job produced: its result (the manifest, and each file, streamed) and its metric curves.
The owner and staff only; anyone else gets the same 404 as for the job itself."""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.response import Response

from clockq.jobs import metrics as job_metrics
from clockq.jobs.models import Job
from clockq.jobs.results import SAFE_NAME, ResultStore
from webapp.access import visible_jobs
from webapp.api import COMMON_ERRORS, JOB_ID, NOT_FOUND
from webapp.serializers import ErrorSerializer, MetricsSerializer, ResultSerializer

BOUNDARIES_SHOWN = 2000  # the newest slice ends marked on a curve

NO_RESULT = {"detail": "This job has no result: it has not succeeded, or it wrote none."}


def result_file_response(job: Job, name: str):
    """The file as a streamed download, with its size and SHA-256 from the manifest; None when
    the manifest does not list it or it is gone from the disk."""
    entry = next((f for f in job.result_files if f.get("name") == name), None)
    if entry is None:
        return None
    try:
        handle = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR).open(job.pk, name)
    except FileNotFoundError:
        return None
    response = FileResponse(handle, as_attachment=True, filename=name, content_type="application/octet-stream")
    response["Content-Length"] = str(entry["bytes"])
    response["X-Checksum-SHA256"] = entry["sha256"]
    response["ETag"] = f'"{entry["sha256"]}"'
    return response


@extend_schema(
    summary="A finished job's result: its files with their sizes and SHA-256",
    parameters=[JOB_ID],
    responses={200: ResultSerializer, 404: NOT_FOUND, **COMMON_ERRORS},
)
@api_view(["GET"])
def job_result(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    if not job.result_files:
        return Response(NO_RESULT, status=404)
    files = [
        {**f, "url": request.build_absolute_uri(reverse("api-job-result-file", args=[job.pk, f["name"]]))}
        for f in job.result_files
    ]
    return Response({"job": job.pk, "bytes": job.result_bytes, "stored_at": job.result_stored_at, "files": files})


@extend_schema(
    operation_id="jobs_result_file_retrieve",
    summary="Download one file of a job's result (streamed)",
    parameters=[
        JOB_ID,
        OpenApiParameter(
            "name",
            {"type": "string", "pattern": SAFE_NAME.pattern},
            OpenApiParameter.PATH,
            description="A file the job's result manifest lists (GET /api/jobs/{job_id}/result), for "
            "example `state.bin`, which a synthetic job writes.",
            examples=[OpenApiExample("a synthetic job's result", value="state.bin")],
        ),
    ],
    responses={
        (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="The file."),
        404: OpenApiResponse(ErrorSerializer, description="No such job, or file, or not the caller's."),
        **COMMON_ERRORS,
    },
)
@api_view(["GET"])
def job_result_file(request, job_id: int, name: str):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    response = result_file_response(job, name)
    return response if response is not None else Response({"detail": "No such result file."}, status=404)


def metrics_payload(job: Job) -> dict:
    """Each metric's points, and the slice ends to mark on the curves: at the job's metric step
    when the slice ended, with its outcome (`yielded`: it made way for another job) and whether
    an RT job preempted it."""
    ends = (
        job.slices.filter(last_step__isnull=False)
        .order_by("-ended_at", "-id")
        .values_list("last_step", "outcome", "preempted", "ended_at")[:BOUNDARIES_SHOWN]
    )
    return {
        "job": job.pk,
        "metrics": job_metrics.curves(job.pk),
        "slice_ends": [
            {"step": step, "outcome": outcome, "preempted": preempted, "at": at}
            for step, outcome, preempted, at in reversed(ends)
        ],
    }


@extend_schema(
    summary="A job's metric curves (loss against step, ...), with its slice ends",
    parameters=[JOB_ID],
    responses={200: MetricsSerializer, 404: NOT_FOUND, **COMMON_ERRORS},
)
@api_view(["GET"])
def job_metrics_view(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    return Response(metrics_payload(job))
