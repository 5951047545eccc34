"""GET /api/kpis?since=...&until=...: the KPIs of a time window, from the rollup tables.

Any authenticated user may read them, like /api/queues: they are cluster-wide counts and times
per tier, and name no job, user or workload.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from clockq.kpis import reports as kpi_reports
from webapp.api import COMMON_ERRORS

DEFAULT_WINDOW = timedelta(hours=1)
# Whole hours are read from the hourly rollup rows, so the cost grows by some 13 rows per hour
# of window (5 tiers, 8 GPUs) plus the ragged minutes at its ends; bench/kpis.py times a year.
MAX_WINDOW = timedelta(days=366)
# Far enough from datetime's own limits that rounding to whole minutes cannot overflow.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


class BadWindow(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def parse_when(field: str, raw: str) -> datetime:
    """ISO 8601, a date (midnight UTC) or a date and time; without an offset, UTC."""
    try:
        when = parse_datetime(raw)
        if when is None and (day := parse_date(raw)) is not None:
            when = datetime.combine(day, datetime.min.time())
    except ValueError:  # well formed, but no such day or time (2026-02-30)
        when = None
    if when is None:
        raise BadWindow(field, f"not an ISO 8601 date or time: {raw[:40]!r}")
    if timezone.is_naive(when):
        when = when.replace(tzinfo=UTC)
    try:
        when = when.astimezone(UTC)
    except OverflowError:
        raise BadWindow(field, "out of range") from None
    if not EARLIEST <= when <= LATEST:
        raise BadWindow(field, f"must lie between {EARLIEST.date()} and {LATEST.date()}")
    return when


def window_of(query, now: datetime) -> tuple[datetime, datetime]:
    """(since, until) from the query string; by default the hour up to now."""
    until = parse_when("until", query["until"]) if "until" in query else now
    since = parse_when("since", query["since"]) if "since" in query else until - DEFAULT_WINDOW
    if until <= since:
        raise BadWindow("until", "must be later than since")
    if until - since > MAX_WINDOW:
        raise BadWindow("until", f"the window is at most {MAX_WINDOW.days} days long")
    return since, until


# --- For the OpenAPI schema only: summary() builds the answer. ---------------------------------


class WaitHistogramSerializer(serializers.Serializer):
    bounds_ms = serializers.ListField(child=serializers.IntegerField(), help_text="Upper bound of each bucket.")
    counts = serializers.ListField(child=serializers.IntegerField(), help_text="One more than bounds: longer waits.")


class TierKpisSerializer(serializers.Serializer):
    started = serializers.IntegerField(help_text="Jobs whose first start fell in the window.")
    wait_mean_s = serializers.FloatField(allow_null=True, help_text="Mean wait from submission to first start.")
    wait_p95_s = serializers.FloatField(allow_null=True, help_text="From the histogram, interpolated in its bucket.")
    wait_target_s = serializers.FloatField(allow_null=True)
    wait_histogram = WaitHistogramSerializer()
    ended = serializers.DictField(child=serializers.IntegerField(), help_text="Jobs that ended, by state.")
    timeout_rate = serializers.FloatField(allow_null=True, help_text="timed_out / (succeeded + failed + timed_out)")
    on_time = serializers.IntegerField()
    on_time_rate = serializers.FloatField(allow_null=True, help_text="on_time / (succeeded + failed + timed_out)")
    late = serializers.IntegerField(help_text="Jobs marked late (past their wait target) in the window.")
    promotions = serializers.IntegerField(help_text="Promotions and batch chances.")
    slices = serializers.IntegerField()
    slice_outcomes = serializers.DictField(child=serializers.IntegerField())
    switches = serializers.IntegerField(help_text="Yielded slices.")
    switch_mean_ms = serializers.FloatField(allow_null=True, help_text="Checkpoint plus restore, per switch.")
    gpu_busy_share = serializers.FloatField(allow_null=True, help_text="Slice GPU time / GPU capacity.")
    gpu_util_mean = serializers.FloatField(allow_null=True, help_text="NVML utilisation x slice time / capacity.")
    busy_gpu_hours = serializers.FloatField()
    useful_gpu_hours = serializers.FloatField(help_text="Work time of completed, yielded and continued slices.")
    cost_per_useful_gpu_hour = serializers.FloatField(allow_null=True)


class GpuCapacitySerializer(serializers.Serializer):
    workers = serializers.IntegerField(help_text="GPU workers seen in the window.")
    capacity_gpu_hours = serializers.FloatField()
    busy_share = serializers.FloatField(allow_null=True)
    util_mean = serializers.FloatField(allow_null=True)


class KpisSerializer(serializers.Serializer):
    since = serializers.DateTimeField(help_text="The window's start, rounded down to a minute.")
    until = serializers.DateTimeField(help_text="The window's end, rounded up to a minute.")
    minutes = serializers.IntegerField()
    rolled_up_until = serializers.DateTimeField(allow_null=True, help_text="Minutes from here on are not in yet.")
    gpu_hour_price = serializers.FloatField(help_text="CLOCKQ_GPU_HOUR_PRICE")
    gpus = GpuCapacitySerializer()
    tiers = serializers.DictField(child=TierKpisSerializer(), help_text="Per tier code (the job's own tier).")
    overall = TierKpisSerializer()


@extend_schema(
    summary="KPIs of a time window, per tier and overall",
    description="Wait (mean, p95), ends by state, timeout and on-time rates, GPU busy share and "
    "utilisation, cost per useful GPU-hour, promotions, slice outcomes and switch cost. "
    "The window is widened to whole minutes. See README, KPIs.",
    parameters=[
        OpenApiParameter("since", OpenApiTypes.DATETIME, description="ISO 8601; default: an hour before `until`."),
        OpenApiParameter("until", OpenApiTypes.DATETIME, description="ISO 8601; default: now. At most 31 days on."),
    ],
    responses={
        200: KpisSerializer,
        400: OpenApiResponse(OpenApiTypes.OBJECT, description="A bad `since` or `until`; the field says why."),
        **COMMON_ERRORS,
    },
)
@api_view(["GET"])
def kpis(request):
    try:
        since, until = window_of(request.query_params, timezone.now())
    except BadWindow as exc:
        return Response({exc.field: [str(exc)]}, status=400)
    return Response(kpi_reports.summary(since, until))
