"""The families of /metrics that say whether the cluster's parts are there: the workers alive
(their heartbeats), the beat (when it last sent a periodic task) and the checkpoint storage's
room. Prometheus's alerting rules (compose/prometheus/rules/) fire on them.

A worker that dies drops out of `clockq_worker_up` when its heartbeat expires (15 s): Prometheus
tells a missing worker by a series it saw recently and sees no more, so every worker has a series
of its own, named as Celery names it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily, Metric

from clockq.jobs.periodic import beat_last_run


def liveness_families(workers: list[dict] | None) -> Iterator[Metric]:
    """`workers`: the live workers' heartbeats, or None when the broker did not answer (the
    family is then empty, and clockq_broker_up says why)."""
    yield _workers_up(workers or [])
    beat = GaugeMetricFamily(
        "clockq_beat_last_run_timestamp_seconds",
        "When celery beat last sent an enabled periodic task (Unix time), as its scheduler writes it back "
        "to the database after each send.",
    )
    last = beat_last_run()
    if last is not None:
        beat.add_metric([], last.timestamp())
    yield beat
    yield from _checkpoint_disk()


def _workers_up(workers: list[dict]) -> Metric:
    up = GaugeMetricFamily(
        "clockq_worker_up",
        "1 for each Celery worker whose heartbeat is live (role gpu, control or predictor); a worker that "
        "stopped has no series.",
        labels=["worker", "role", "host", "gpu"],
    )
    for info in sorted(workers, key=lambda w: str(w.get("hostname"))):
        name = str(info.get("hostname", ""))
        prefix, _, host = name.partition("@")
        gpu = info.get("gpu")
        role = "gpu" if gpu is not None else prefix
        up.add_metric([name, role, host, "" if gpu is None else str(gpu)], 1)
    return up


def _checkpoint_disk() -> Iterator[Metric]:
    """The filesystem of CLOCKQ_CHECKPOINT_DIR as the web role sees it: with many hosts, the
    shared storage they all checkpoint to. Left out when it cannot be read from here."""
    size = GaugeMetricFamily(
        "clockq_checkpoint_disk_size_bytes", "Size of the filesystem that holds the checkpoint folder."
    )
    free = GaugeMetricFamily(
        "clockq_checkpoint_disk_free_bytes",
        "Room left for clockq (not root) on the filesystem that holds the checkpoint folder.",
    )
    try:
        usage = shutil.disk_usage(settings.CLOCKQ_CHECKPOINT_DIR)
    except OSError:
        usage = None
    if usage is not None:
        size.add_metric([], usage.total)
        free.add_metric([], usage.free)
    yield size
    yield free
