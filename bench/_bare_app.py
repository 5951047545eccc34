"""A bare Celery app whose one task re-sends itself: the floor under a clockq slice switch.

It copies clockq's broker settings (acks_late, prefetch 1, strict queue order, JSON, five queues
on a direct exchange) but loads no Django and touches no database. bench/switch_cost.py runs it
under a worker with the same pool flags as a clockq GPU worker and checks that the settings
still match clockq's.

Each hop stamps time.time() when the task body starts and after it has sent the next hop. The
stamps stay in the worker's memory until the last hop, which writes them all to one Redis list,
so the measured loop does nothing but Celery's own work.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery
from celery.signals import worker_ready
from kombu import Exchange, Queue

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
QUEUES = ("bare_rt", "bare_hp", "bare_sp", "bare_bp", "bare_bk")
HOP_QUEUE = "bare_sp"  # the third queue, like clockq's SP tier
HOP_TASK = "bench.bare_hop"
READY_KEY = "bench:bare:ready"


def stamps_key(run: str) -> str:
    return f"bench:bare:stamps:{run}"


app = Celery("bare", broker=BROKER_URL)
app.conf.update(
    task_queues=[Queue(name, Exchange("bare", type="direct"), routing_key=name) for name in QUEUES],
    task_default_queue=HOP_QUEUE,
    task_default_exchange="bare",
    task_default_routing_key=HOP_QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    result_backend=None,
    broker_transport_options={"queue_order_strategy": "priority", "visibility_timeout": 6 * 3600},
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_stamps: list[tuple[float, float]] = []


@app.task(name=HOP_TASK, acks_late=True, ignore_result=True)
def hop(run: str, remaining: int) -> None:
    entered = time.time()
    if remaining > 0:
        hop.apply_async((run, remaining - 1), queue=HOP_QUEUE, routing_key=HOP_QUEUE)
    _stamps.append((entered, time.time()))
    if remaining <= 0:
        client = redis.Redis.from_url(BROKER_URL)
        client.rpush(stamps_key(run), *(f"{a!r} {b!r}" for a, b in _stamps))
        _stamps.clear()


@worker_ready.connect
def _announce(sender=None, **_kwargs) -> None:
    redis.Redis.from_url(BROKER_URL).set(READY_KEY, getattr(sender, "hostname", "bare"), ex=600)
