"""Free GPUs: the one definition, for the order's boundaries and for the RT lanes.

A GPU is free when its main worker would claim a job now and runs none: the database says which
worker runs each job (`free_of`). Which workers would claim now depends on where the job is.

- A job that waits in the queue already (a boundary's question: `making_way.makes_way_for` lets
  nobody make way while a GPU is free, since the waiting job takes that one, above all the GPU
  of a victim that has just left for it and is claiming). A live worker that waits idle on the
  broker takes a waiting job's message the moment it is pushed, so it never stays free while a
  job waits; and a worker that died keeps its heartbeat for up to 15 s. So the heartbeats are
  no answer here. What stays free while a job waits is a GPU between two jobs (checkpoint,
  requeue, the message hop, the claim), which takes tens of milliseconds; or one that takes
  nothing (its worker died, backs off after a storage failure, or has not the memory for the
  job). So a worker marks its GPU here as it leaves a job (`mark_free`, with the broker's own
  clock: hosts' clocks may differ), and it counts for FREE_S after that
  (`add_recently_freed`). A GPU whose worker died counts as free for at most FREE_S.
- A job about to be put back in the queue (an RT lane leaves its RT job to a GPU that runs
  nothing, workers/rt_lane.py). Here a worker idle on the broker is the answer: it takes the
  message the moment it is pushed. Its heartbeat says that it lives and takes jobs
  (`idle_candidates`). A dead worker's heartbeat outlives it, so a lane leaves a job to the
  others once only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import redis

KEY = "clockq:gpus:freed"
# How long a GPU that left its job counts as free: a switch's requeue, hop and claim take
# 5-30 ms, and up to about 100 ms on two loaded cores behind 256 MB checkpoints.
FREE_S = 0.5

# Scripts, so that the broker's clock stamps and judges the marks. A member per worker: a
# worker's newer mark replaces its older one, and marks older than FREE_S are dropped. (Redis
# before 5 replicates a script that reads the clock only as its effects: hence the first line.)
_MARK = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], 60)
return 1
"""
_RECENT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""


def mark_free(r: redis.Redis, hostname: str) -> None:
    """The worker `hostname` is leaving its job: its GPU is free until it claims the next."""
    r.eval(_MARK, 1, KEY, hostname, FREE_S)


def add_recently_freed(pipe: redis.client.Pipeline) -> None:
    """Queue the read of the workers that left a job less than FREE_S ago (`parse`)."""
    pipe.eval(_RECENT, 1, KEY, FREE_S)


def parse(reply: list) -> frozenset[str]:
    return frozenset(h.decode() if isinstance(h, bytes) else str(h) for h in reply or ())


def free_of(candidates: Iterable[str], running: Collection[str]) -> frozenset[str]:
    """The free GPUs among the main workers `candidates`: those that run no job, `running` being
    the workers the database says run one."""
    return frozenset(candidates) - frozenset(running)


def idle_candidates(beats: Iterable[dict[str, Any]], *, besides: str) -> frozenset[str]:
    """The main workers other than `besides` that live and take jobs (not drained), as their
    heartbeats say (clockq/bus/heartbeat.py): what would claim a job put back in the queue now,
    if it runs none (`free_of`)."""
    return frozenset(
        b["hostname"]
        for b in beats
        if b.get("gpu") is not None and b.get("consuming", True) and b.get("hostname") != besides
    )
