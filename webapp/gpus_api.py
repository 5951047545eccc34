"""GET /api/gpus: the latest telemetry sample of every GPU in the cluster, read from Redis.

Each GPU worker publishes its newest sample at most once a second with a TTL of
`stale_after_s`; a GPU whose host stops publishing drops out of the list by itself.
"""

from __future__ import annotations

import time

import redis
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import api_view
from rest_framework.response import Response

from clockq.bus import gpu_samples
from clockq.bus.client import client
from webapp.api import COMMON_ERRORS
from webapp.serializers import ErrorSerializer, GpusSerializer


@extend_schema(
    summary="The latest telemetry sample of every GPU",
    responses={
        200: GpusSerializer,
        503: OpenApiResponse(ErrorSerializer, description="The broker (Redis) cannot be read."),
        **COMMON_ERRORS,
    },
)
@api_view(["GET"])
def gpus(request):
    try:
        samples = gpu_samples.cluster_samples(client())
    except redis.RedisError as exc:
        return Response({"detail": f"broker unavailable: {type(exc).__name__}"}, status=503)
    return Response(
        {
            "gpus": [sample.to_dict() for sample in samples],
            "stale_after_s": gpu_samples.TTL_S,
            "now": time.time(),
        }
    )
