"""A bounded ring of timed samples in one Redis sorted set, shared by every host.

Why a sorted set, scored by the sample's time slot (Unix seconds, floored to the ring's step):

- One sample per slot, whoever writes it. A write removes what its slot holds and adds the new
  sample in one MULTI/EXEC, so a re-delivered or doubled beat tick, or the same tick run by two
  control workers on two hosts, leaves one sample for the slot (the last written), never two.
- Bounded by age and by count. Each write trims samples older than `keep_s` and keeps at most
  `max_samples`, so the ring holds the same few hundred KB however often it is written, and a
  writer that stops leaves a ring that a reader still bounds by its window.
- A window is one ZRANGEBYSCORE, oldest first: no scan, no per-sample keys.

Members are JSON objects that carry their slot as `t`, so two slots never share a member. They
may come from another host's (older) code: `read` skips what does not parse as an object and
says how many it skipped. What a sample holds is the writer's business, not this module's.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any

import redis

log = logging.getLogger("clockq.samples")


@dataclass(frozen=True)
class SampleRing:
    key: str
    step_s: int  # a slot's length: samples written within one slot replace each other
    keep_s: int  # samples older than this (from the newest write) are trimmed
    max_samples: int  # and at most this many are kept, the newest

    def __post_init__(self) -> None:
        for name in ("step_s", "keep_s", "max_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")

    def slot(self, ts: float) -> int:
        """The slot (Unix seconds, a multiple of step_s) that time `ts` falls in."""
        if not math.isfinite(ts):
            raise ValueError(f"a sample's time must be a finite number, not {ts!r}")
        return int(ts // self.step_s) * self.step_s

    def write(self, r: redis.Redis, ts: float, values: dict[str, Any]) -> int:
        """Store `values` as the sample of ts's slot, replacing the slot's sample, and trim the
        ring. Returns the slot. Raises redis.RedisError when the broker does not answer."""
        if "t" in values:
            raise ValueError("'t' is the slot's own field; a sample's values cannot name it")
        slot = self.slot(ts)
        member = json.dumps({"t": slot, **values}, separators=(",", ":"), sort_keys=True)
        with r.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(self.key, slot, slot)
            pipe.zadd(self.key, {member: slot})
            pipe.zremrangebyscore(self.key, "-inf", f"({slot - self.keep_s}")
            pipe.zremrangebyrank(self.key, 0, -self.max_samples - 1)
            pipe.execute()
        return slot

    def read(self, r: redis.Redis, since: float, until: float) -> list[dict[str, Any]]:
        """The samples whose slot lies in [since, until], oldest first, each with its slot as `t`.
        Raises redis.RedisError when the broker does not answer."""
        found: list[dict[str, Any]] = []
        skipped = 0
        rows: list[tuple[bytes, float]] = r.zrangebyscore(self.key, since, until, withscores=True)  # type: ignore[assignment]
        for raw, score in rows:
            try:
                sample = json.loads(raw)
            except ValueError:
                sample = None
            if not isinstance(sample, dict):
                skipped += 1
                continue
            sample["t"] = int(score)  # the score is the slot; a member cannot claim another
            found.append(sample)
        if skipped:
            log.warning("%s: skipped %s sample(s) that are not JSON objects", self.key, skipped)
        return found
