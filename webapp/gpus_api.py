"""GET /api/gpus: the latest telemetry sample of every GPU in the cluster, read from Redis.

Each GPU worker publishes its newest sample at most once a second with a TTL of
`stale_after_s`; a GPU whose host stops publishing drops out of the list by itself.
"""

from __future__ import annotations

import time

import redis
from rest_framework.decorators import api_view
from rest_framework.response import Response

from clockq.bus import gpu_samples
from clockq.bus.client import client


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
