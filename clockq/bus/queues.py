"""Read-only views of the Redis broker: queue lengths, and which dispatch messages it holds.

These read kombu's Redis layout directly (one list per queue, plus the `unacked` hash of
delivered-but-unacknowledged messages), because Celery offers no cheap way to ask either.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from clockq.bus import free_gpus, lanes
from clockq.bus.client import client
from clockq.bus.dispatch import RUN_SLICE_TASK
from clockq.policy.tiers import QUEUES_IN_ORDER

UNACKED_KEY = "unacked"
UNACKED_INDEX_KEY = "unacked_index"
SCAN_CHUNK = 1000


def waiting_by_rank(queues: Sequence[str] = QUEUES_IN_ORDER) -> list[int]:
    """Messages waiting in each tier's queue, most urgent first. One round trip."""
    pipe = client().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
    return [int(n) for n in pipe.execute()]


@dataclass(frozen=True)
class BrokerView:
    """What a slice boundary reads from the broker first, in one round trip."""

    waiting: list[int] = field(default_factory=list)  # messages per tier rank, most urgent first
    freed: frozenset[str] = frozenset()  # workers that left a job just now (clockq/bus/free_gpus.py)
    idle_lanes: int = 0  # idle standby RT lanes (clockq/bus/lanes.py), counted only if asked


def boundary_view(queues: Sequence[str] = QUEUES_IN_ORDER, *, count_lanes: bool = False) -> BrokerView:
    """The queue lengths and the GPUs just freed (and, if asked, the idle RT lanes). One round trip."""
    pipe = client().pipeline(transaction=False)
    for queue in queues:
        pipe.llen(queue)
    free_gpus.add_recently_freed(pipe)
    if count_lanes:
        lanes.add_idle_count(pipe)
    replies = pipe.execute()
    idle = int(replies.pop()) if count_lanes else 0
    *lengths, freed = replies
    return BrokerView([int(n) for n in lengths], free_gpus.parse(freed), idle)


def parse_dispatch(raw: bytes | str) -> tuple[int, str] | None:
    """(job id, token) from a raw kombu message, or None if it is not a dispatch message."""
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != RUN_SLICE_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return int(args[0]), str(args[1])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def queued_messages(queue: str) -> Iterator[tuple[int, str]]:
    """Every dispatch message waiting in `queue`, read in chunks so memory stays bounded."""
    r = client()
    start = 0
    while True:
        chunk = r.lrange(queue, start, start + SCAN_CHUNK - 1)
        for raw in chunk:
            parsed = parse_dispatch(raw)
            if parsed:
                yield parsed
        if len(chunk) < SCAN_CHUNK:
            return
        start += SCAN_CHUNK


def recently_delivered(max_age_s: float) -> dict[str, set[tuple[int, str]]]:
    """Dispatch messages a worker took from a queue less than `max_age_s` ago and has not
    acknowledged yet, by queue. Such a worker is about to claim (or is running) the job."""
    r = client()
    cutoff = time.time() - max_age_s
    fresh_tags: list[bytes] = list(set(r.zrangebyscore(UNACKED_INDEX_KEY, cutoff, "+inf")))  # type: ignore[arg-type]
    found: dict[str, set[tuple[int, str]]] = {}
    if not fresh_tags:
        return found
    for _tag, raw in zip(fresh_tags, r.hmget(UNACKED_KEY, fresh_tags), strict=True):
        if raw is None:
            continue
        try:
            message, _exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            continue
        parsed = parse_dispatch(json.dumps(message))
        if parsed:
            found.setdefault(routing_key, set()).add(parsed)
    return found
