"""Counters of what happened, kept in Redis where it happens, for /metrics to read at scrape time.

Figures that grow with history (slices by outcome, switch costs, first waits, promotions) would
cost a scan of every Slice row per scrape; instead the process where the event happens adds it
to a few Redis hashes (HINCRBY, HINCRBYFLOAT), and every web process reads the same totals back.

- Best effort: a broker error never fails a slice, a claim or a promotion. It is logged at debug,
  the event goes uncounted, and writes pause for `QUIET_AFTER_ERROR_S` so that a dead broker
  costs one timeout, not one per event.
- Written after commit (`transaction.on_commit`): a slice whose transaction rolls back is not
  counted. Outside a transaction the write happens at once.
- Flushing Redis resets them. That is fine for Prometheus counters: `rate()` and `increase()`
  treat a drop to zero as a counter reset.
- Job ends are counted where every end happens, in `transition()` (clockq/jobs/transitions.py),
  with whether the job was on time by the KPIs' definition (clockq/policy/service_levels.py).
- Histograms are kept as per-bucket counts (not cumulative), a count and a sum, written in one
  MULTI so that a reader never sees a count that disagrees with its buckets.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import redis
from django.db import transaction

from clockq.bus.client import client
from clockq.policy.kpis import WAIT_BUCKETS_MS, wait_bucket

log = logging.getLogger("clockq.counters")

SLICES_KEY = "clockq:counters:slices"  # "<tier>:<outcome>" -> slices, "<tier>:<outcome>:ms" -> GPU ms
SWITCH_KEY = "clockq:counters:switch"  # histogram of checkpoint + restore ms of yielded slices
WAIT_KEY = "clockq:counters:wait"  # histogram of first waits (submission -> first start), ms
PROMOTIONS_KEY = "clockq:counters:promotions"  # "<from>:<to>:<kind>" -> promotions
ENDS_KEY = "clockq:counters:ends"  # "<tier>:<state>:<on time: 1 or 0>" -> jobs ended
KEYS = (SLICES_KEY, SWITCH_KEY, WAIT_KEY, PROMOTIONS_KEY, ENDS_KEY)

# Upper bounds (ms) of the switch cost histogram's buckets: a switch is a checkpoint and a restore,
# from about a millisecond (a small state on local disk) to seconds (gigabytes).
SWITCH_BUCKETS_MS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000)

# Who promoted a job (the `actor` of clockq/jobs/promotion.py) -> the kind of promotion. Anyone
# else promoted it by hand; their name is not a label, so the label's values stay few.
PROMOTION_KINDS = {"promotion tick": "starved", "batch chance": "batch_chance"}
BY_HAND = "by_hand"

QUIET_AFTER_ERROR_S = 5.0
_quiet_until = -math.inf


# --- writing, where the events happen ------------------------------------------------------------


def count_slice(
    *, tier: str, outcome: str, used_ms: float, switch_ms: float | None = None, writer: Executor | None = None
) -> None:
    """A slice of a job of `tier` ended with `outcome`, after holding its GPU `used_ms`.
    `switch_ms` (checkpoint + restore) is given for a slice that made way for another job.
    With `writer`, the write runs there after the commit: a GPU worker's slice boundary does
    not wait for it (its round trip is 0.3-0.5 ms of a switch)."""

    def write(pipe: redis.client.Pipeline) -> None:
        pipe.hincrby(SLICES_KEY, f"{tier}:{outcome}", 1)
        pipe.hincrbyfloat(SLICES_KEY, f"{tier}:{outcome}:ms", float(used_ms))
        if switch_ms is not None:
            _observe(pipe, SWITCH_KEY, tier, _bucket(switch_ms, SWITCH_BUCKETS_MS), switch_ms)

    _after_commit(write, writer)


def count_first_start(*, tier: str, wait_ms: int, writer: Executor | None = None) -> None:
    """A job of `tier` (its own tier) started for the first time, `wait_ms` after submission.
    `writer` as count_slice's: the job's first step does not wait for the write."""
    _after_commit(lambda pipe: _observe(pipe, WAIT_KEY, tier, wait_bucket(wait_ms), wait_ms), writer)


def count_promotion(*, from_tier: str, to_tier: str, actor: str) -> None:
    """A job was lifted from `from_tier` to `to_tier` by `actor`."""
    kind = PROMOTION_KINDS.get(actor, BY_HAND)
    _after_commit(lambda pipe: pipe.hincrby(PROMOTIONS_KEY, f"{from_tier}:{to_tier}:{kind}", 1))


def count_job_end(*, tier: str, state: str, on_time: bool) -> None:
    """A job of `tier` (its own tier) ended in the terminal `state`, on time or not."""
    _after_commit(lambda pipe: pipe.hincrby(ENDS_KEY, f"{tier}:{state}:{int(on_time)}", 1))


def _observe(pipe: redis.client.Pipeline, key: str, label: str, bucket: int, value: float) -> None:
    pipe.hincrby(key, f"{label}:b{bucket}", 1)
    pipe.hincrby(key, f"{label}:count", 1)
    pipe.hincrbyfloat(key, f"{label}:sum", float(value))


def _bucket(value: float, bounds: Sequence[float]) -> int:
    """Index of the first bound >= value (len(bounds) beyond the last one)."""
    return bisect.bisect_left(bounds, value)


def _after_commit(write: Callable[[redis.client.Pipeline], object], writer: Executor | None = None) -> None:
    # robust: whatever the write raises, the commit it follows has happened and stays a success.
    if writer is None:
        transaction.on_commit(lambda: _write_now(write), robust=True)
    else:
        transaction.on_commit(lambda: writer.submit(_write_now, write), robust=True)


def _write_now(write: Callable[[redis.client.Pipeline], object]) -> None:
    global _quiet_until
    if time.monotonic() < _quiet_until:
        return
    try:
        pipe = client().pipeline(transaction=True)
        write(pipe)
        pipe.execute()
    except redis.RedisError as exc:
        _quiet_until = time.monotonic() + QUIET_AFTER_ERROR_S
        log.debug(
            "counter not written (%s: %s); pausing counters for %s s", type(exc).__name__, exc, QUIET_AFTER_ERROR_S
        )


# --- reading, at scrape time -----------------------------------------------------------------------


@dataclass
class Histogram:
    """Per-bucket counts (not cumulative; the last one is beyond the last bound), count and sum."""

    buckets: list[int]
    count: int = 0
    sum: float = 0.0

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for n in self.buckets:
            running += n
            out.append(running)
        return out


@dataclass
class Counters:
    slices: dict[tuple[str, str], int] = field(default_factory=dict)  # (tier, outcome) -> slices
    slice_ms: dict[tuple[str, str], float] = field(default_factory=dict)  # (tier, outcome) -> GPU ms
    switch: dict[str, Histogram] = field(default_factory=dict)  # tier -> switch costs, ms
    wait: dict[str, Histogram] = field(default_factory=dict)  # tier -> first waits, ms
    promotions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (from, to, kind) -> count
    ends: dict[tuple[str, str, bool], int] = field(default_factory=dict)  # (tier, state, on time) -> jobs


def read_counters(r: redis.Redis | None = None) -> Counters:
    """Every counter, in one round trip. Fields that do not parse are skipped (a shared Redis
    may hold anything); a missing hash reads as nothing counted yet."""
    pipe = (r or client()).pipeline(transaction=False)
    for key in KEYS:
        pipe.hgetall(key)
    slices, switch, wait, promotions, ends = (_decode(h) for h in pipe.execute())
    found = Counters()
    for name, value in slices.items():
        parts = name.split(":")
        if len(parts) == 2 and (n := _int(value)) is not None:
            found.slices[(parts[0], parts[1])] = n
        elif len(parts) == 3 and parts[2] == "ms" and (ms := _float(value)) is not None:
            found.slice_ms[(parts[0], parts[1])] = ms
    found.switch = _histograms(switch, len(SWITCH_BUCKETS_MS) + 1)
    found.wait = _histograms(wait, len(WAIT_BUCKETS_MS) + 1)
    for name, value in promotions.items():
        parts = name.split(":")
        if len(parts) == 3 and (n := _int(value)) is not None:
            found.promotions[(parts[0], parts[1], parts[2])] = n
    for name, value in ends.items():
        parts = name.split(":")
        if len(parts) == 3 and parts[2] in ("0", "1") and (n := _int(value)) is not None:
            found.ends[(parts[0], parts[1], parts[2] == "1")] = n
    return found


def _histograms(fields: dict[str, str], size: int) -> dict[str, Histogram]:
    out: dict[str, Histogram] = defaultdict(lambda: Histogram([0] * size))
    for name, value in fields.items():
        label, _, part = name.rpartition(":")
        if not label:
            continue
        if part == "count" and (n := _int(value)) is not None:
            out[label].count = n
        elif part == "sum" and (s := _float(value)) is not None:
            out[label].sum = s
        elif part.startswith("b") and part[1:].isdigit() and int(part[1:]) < size and (n := _int(value)) is not None:
            out[label].buckets[int(part[1:])] = n
    return dict(out)


def _decode(raw: dict) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _float(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
