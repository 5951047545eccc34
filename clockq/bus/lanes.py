"""What passes through Redis between a GPU's main worker and its standby RT lane.

- The pause request, one key per main worker (`PAUSE_KEY` + its name): the lane sets it when it
  takes an RT job, keeps it alive (a short TTL, renewed while the RT job runs) and deletes it
  when the RT job ends. A lane killed with kill -9 stops renewing it, so the key expires and
  the paused job resumes: the key is the lane's heartbeat for the pause. The main worker, which
  knows the lane is dead the instant it dies (workers/lane_life.py), drops it sooner. The key is
  the only truth: each change is announced on the signal channel (clockq/bus/signals.py) only
  to wake the main worker, which reads the key at its next step (workers/run/pause.py), with no
  round trip at the steps in between.
- The idle lanes (`IDLE_KEY`, a sorted set scored by expiry): a running job's look for an RT job
  (workers/run/boundary.py) does not make way through a checkpoint while idle lanes take
  every RT job waiting (`clockq.policy.lanes.lanes_take_urgent`).
- What became of each RT job a lane took (`SERVED_KEY`, a hash of counts by path) and of each
  pause (`PAUSES_KEY`, a short list), for bench/rt_latency.py, the tests and operators.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from clockq.bus import signals
from clockq.bus.client import client

PAUSE_KEY = "clockq:lane:pause:"
IDLE_KEY = "clockq:lanes:idle"
SERVED_KEY = "clockq:lanes:served"
PAUSES_KEY = "clockq:lanes:pauses"
PAUSES_KEPT = 1000
PAUSE_TTL_S = 2.0  # a lane that stops renewing its request (killed) frees its paused job this late
IDLE_TTL_S = 15.0  # an idle mark outlives a killed lane by at most this much (the heartbeat's TTL)

MAIN_PREFIX, LANE_PREFIX = "gpu", "rt"  # gpu0@host's standby RT lane is rt0@host

MODE_PAUSE = "pause"  # pause in place at the next step
MODE_CHECKPOINT = "checkpoint"  # leave through a checkpoint at the next step, and start nothing until it ends


def lane_name(main: str) -> str:
    """The RT lane of the GPU whose main worker is `main`: gpu0@host -> rt0@host."""
    return LANE_PREFIX + main.removeprefix(MAIN_PREFIX)


def main_of(name: str) -> str | None:
    """The main worker of the GPU whose RT lane is `name` (rt0@host -> gpu0@host); None if
    `name` names no lane."""
    index, at, host = name.removeprefix(LANE_PREFIX).partition("@")
    if not name.startswith(LANE_PREFIX) or not at or not index.isdigit() or not host:
        return None
    return f"{MAIN_PREFIX}{index}@{host}"


@dataclass(frozen=True)
class PauseRequest:
    rt_job: int
    lane: str  # the lane's worker name
    mode: str  # MODE_PAUSE or MODE_CHECKPOINT
    target: int | None  # the running job it was made for (None: the GPU was free)

    def applies_to(self, job_id: int) -> bool:
        return self.target is None or self.target == job_id

    @classmethod
    def parse(cls, raw: bytes | str | None) -> PauseRequest | None:
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            target = data.get("target")
            return cls(
                int(data["rt_job"]), str(data["lane"]), str(data["mode"]), None if target is None else int(target)
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def request_pause(r: redis.Redis, main: str, request: PauseRequest) -> None:
    """Ask the main worker `main` to pause (or leave) at its next step, and say so at once."""
    raw = json.dumps(asdict(request))
    r.set(PAUSE_KEY + main, raw, px=int(PAUSE_TTL_S * 1000))
    signals.announce_lane(r, main)


def keep_pause(r: redis.Redis, main: str, rt_job: int) -> bool:
    """Renew the request while its RT job runs; False if it is gone (expired) or not this job's."""
    request = PauseRequest.parse(r.get(PAUSE_KEY + main))
    if request is None or request.rt_job != rt_job:
        return False
    return bool(r.pexpire(PAUSE_KEY + main, int(PAUSE_TTL_S * 1000)))


def release(r: redis.Redis, main: str, rt_job: int) -> None:
    """The RT job ended: the paused job resumes (if the request is still this RT job's)."""
    request = PauseRequest.parse(r.get(PAUSE_KEY + main))
    if request is not None and request.rt_job == rt_job:
        r.delete(PAUSE_KEY + main)
    signals.announce_lane(r, main)


def drop_request_of(r: redis.Redis, main: str, lane: str) -> bool:
    """The lane `lane` is dead (workers/lane_life.py): its request stands for nothing now, and
    the paused job resumes at once instead of when the request expires. Whether one was dropped.
    (Read, then deleted: only a live process of `lane` could put a new one between the two, and
    the caller knows there is none.)"""
    request = PauseRequest.parse(r.get(PAUSE_KEY + main))
    if request is None or request.lane != lane:
        return False
    r.delete(PAUSE_KEY + main)
    signals.announce_lane(r, main)
    return True


def pause_request(r: redis.Redis, main: str) -> PauseRequest | None:
    """The request standing for the main worker `main`, if any: the truth the signal hints at."""
    return PauseRequest.parse(r.get(PAUSE_KEY + main))


def mark_idle(r: redis.Redis, lane: str) -> None:
    r.zadd(IDLE_KEY, {lane: time.time() + IDLE_TTL_S})


def keep_idle(r: redis.Redis, lane: str) -> None:
    """Renew the idle mark of a lane that is still idle (a busy lane is not marked again)."""
    r.zadd(IDLE_KEY, {lane: time.time() + IDLE_TTL_S}, xx=True)


def mark_busy(r: redis.Redis, lane: str) -> None:
    r.zrem(IDLE_KEY, lane)


def add_idle_count(pipe: redis.client.Pipeline) -> None:
    """Queue the count of idle lanes (in a boundary's one round trip: clockq/bus/queues.py)."""
    pipe.zcount(IDLE_KEY, time.time(), "+inf")


def count_served(r: redis.Redis, path: str) -> None:
    r.hincrby(SERVED_KEY, path, 1)


def served() -> dict[str, int]:
    """RT jobs that lanes took, by path (`clockq.policy.lanes.LanePath`), since the broker started."""
    return {_text(k): int(v) for k, v in client().hgetall(SERVED_KEY).items()}


def record_pause(r: redis.Redis, pause: dict[str, Any]) -> None:
    """Keep what became of a pause (job, RT job, how long, how it ended) in a short list."""
    pipe = r.pipeline(transaction=False)
    pipe.lpush(PAUSES_KEY, json.dumps(pause))
    pipe.ltrim(PAUSES_KEY, 0, PAUSES_KEPT - 1)
    pipe.execute()


def pauses() -> list[dict[str, Any]]:
    """The recorded pauses, oldest first."""
    return [json.loads(raw) for raw in reversed(client().lrange(PAUSES_KEY, 0, -1))]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
