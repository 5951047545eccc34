"""The analysis behind bench/rt_latency.py: this process's own subscriber to the RT signals,
and what the Slice and JobEvent rows say about each phase (see that module's docstring)."""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import redis

HALF_MS_TRUNCATION = 0.5  # Slice.used_ms is stored as int(ms)
PHASES = ("signal", "step end", "decide", "checkpoint", "record", "hop+claim")


class SignalLog:
    """This process's own subscriber to clockq's signal channel: when each RT signal arrived."""

    def __init__(self, redis_url: str):
        from clockq.bus.signals import CHANNEL

        self.pubsub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(CHANNEL)
        self.pubsub.get_message(timeout=1)  # the subscribe confirmation
        self.rt_at: list[float] = []  # wall-clock seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-signals", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(redis.RedisError):
                message = self.pubsub.get_message(timeout=0.2)
                if message and message.get("type") == "message":
                    at = time.time()
                    with contextlib.suppress(ValueError, TypeError):
                        signal = json.loads(message["data"])
                        if signal.get("kind") == "urgent" and signal.get("rank") == 0:
                            self.rt_at.append(at)

    def first_after(self, t: float, before: float) -> float | None:
        i = bisect.bisect_left(self.rt_at, t)
        return self.rt_at[i] if i < len(self.rt_at) and self.rt_at[i] <= before else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(redis.RedisError):
            self.pubsub.close()


@dataclass
class Phase:
    label: str
    ids: list[int] = field(default_factory=list)  # measured RT jobs, in submission order
    latencies: list[float] = field(default_factory=list)  # ms
    signal_ms: list[float] = field(default_factory=list)  # submit -> RT signal seen here
    gpus: Counter = field(default_factory=Counter)


def collect(phase: Phase, signals: SignalLog) -> None:
    from clockq.jobs.models import Job, Slice

    rows = Job.objects.filter(pk__in=phase.ids).values("pk", "submitted_at", "first_started_at")
    by_id = {r["pk"]: r for r in rows}
    gpus = dict(Slice.objects.filter(job_id__in=phase.ids).values_list("job_id", "gpu_index"))
    for pk in phase.ids:
        r = by_id[pk]
        submitted, started = r["submitted_at"].timestamp(), r["first_started_at"].timestamp()
        phase.latencies.append((started - submitted) * 1000)
        seen = signals.first_after(submitted, started + 1.0)
        if seen is not None:
            phase.signal_ms.append((seen - submitted) * 1000)
        phase.gpus[gpus.get(pk)] += 1


@dataclass
class BusyCheck:
    all_busy_at_submit: int  # submissions that found every GPU inside a busy-tier slice
    preempted: int  # RT jobs started on a GPU whose previous slice was a busy job cut short for it
    phases: dict[str, list[float]]  # ms, for the preempted ones; they add up to the latency
    busy_slices: Counter  # busy-tier slices during the RT sequence, by outcome
    cut_short: int  # yielded busy slices with used_ms well below the planned slice
    yields_per_rt: float
    planned_ms: list[int]
    plan_reasons: str
    after_yield: Counter  # what the GPU ran next after a busy slice yielded
    during_restore: int  # RT signals that came while the preempted job was still restoring


def check_busy(args, busy: Phase, busy_ids: list[int], t1, signals: SignalLog) -> BusyCheck:
    from clockq.jobs.models import Job

    rt_rows = {r["pk"]: r for r in Job.objects.filter(pk__in=busy.ids).values("pk", "submitted_at", "first_started_at")}
    t0 = min(r["submitted_at"] for r in rt_rows.values())  # the first measured submission
    busy_slices = _busy_slices(busy_ids, t0, t1)
    split = _split_latencies(args.gpus, busy, rt_rows, busy_slices, _yield_times(busy_ids), signals)
    outcomes = Counter(s["outcome"] for s in busy_slices)
    cut_short = sum(1 for s in busy_slices if s["outcome"] == "yielded" and s["used_ms"] < 0.8 * s["planned_ms"])
    return BusyCheck(
        all_busy_at_submit=split.all_busy,
        preempted=split.preempted,
        phases=dict(split.phases),
        busy_slices=outcomes,
        cut_short=cut_short,
        yields_per_rt=outcomes["yielded"] / len(busy.ids) if busy.ids else float("nan"),
        planned_ms=sorted({s["planned_ms"] for s in busy_slices}),
        plan_reasons="/".join(sorted({s["plan_reason"] for s in busy_slices})),
        after_yield=_after_yield(busy_slices, busy.ids),
        during_restore=split.during_restore,
    )


SLICE_FIELDS = (
    "job_id",
    "gpu_index",
    "started_at",
    "ended_at",
    "used_ms",
    "outcome",
    "restore_ms",
    "checkpoint_ms",
    "planned_ms",
    "plan_reason",
)


def _busy_slices(busy_ids: list[int], t0, t1) -> list[dict]:
    """The busy jobs' slices that overlap the RT sequence, from `t0` to `t1`."""
    from clockq.jobs.models import Slice

    return list(Slice.objects.filter(job_id__in=busy_ids, ended_at__gte=t0, started_at__lte=t1).values(*SLICE_FIELDS))


def _yield_times(busy_ids: list[int]) -> dict[int, list[float]]:
    """When each busy job yielded (running -> queued), in order."""
    from clockq.jobs.models import JobEvent

    yields = defaultdict(list)
    for job_id, at in JobEvent.objects.filter(job_id__in=busy_ids, from_state="running", to_state="queued").values_list(
        "job_id", "at"
    ):
        yields[job_id].append(at.timestamp())
    for times in yields.values():
        times.sort()
    return yields


@dataclass
class Split:
    all_busy: int = 0
    preempted: int = 0
    during_restore: int = 0
    phases: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def _split_latencies(gpus: int, busy: Phase, rt_rows: dict, busy_slices: list[dict], yields, signals) -> Split:
    """For each RT job that preempted a busy job P, its latency as PHASES (see bench/rt_latency.py)."""
    from clockq.jobs.models import Slice

    by_gpu = defaultdict(list)
    for s in busy_slices:
        by_gpu[s["gpu_index"]].append(s)
    for slices in by_gpu.values():
        slices.sort(key=lambda s: s["ended_at"])
    rt_gpu = dict(Slice.objects.filter(job_id__in=busy.ids).values_list("job_id", "gpu_index"))
    split = Split()
    for pk in busy.ids:
        submitted, started = rt_rows[pk]["submitted_at"], rt_rows[pk]["first_started_at"]
        inside = {s["gpu_index"] for s in busy_slices if s["started_at"] <= submitted <= s["ended_at"]}
        split.all_busy += len(inside) == gpus
        before = [s for s in by_gpu.get(rt_gpu.get(pk), []) if s["ended_at"] <= started]
        if not before:
            continue
        p = before[-1]
        if p["outcome"] != "yielded" or p["ended_at"] < submitted:
            continue
        split.preempted += 1
        start_s = p["started_at"].timestamp()
        compute_end = start_s + (p["restore_ms"] + p["used_ms"] + HALF_MS_TRUNCATION) / 1000
        yielded_at = next((t for t in yields[p["job_id"]] if start_s <= t <= p["ended_at"].timestamp()), None)
        seen = signals.first_after(submitted.timestamp(), started.timestamp() + 1.0)
        if yielded_at is None or seen is None:
            continue
        # The RT signal came while P was still restoring: its first step ran only after that.
        split.during_restore += seen < start_s + p["restore_ms"] / 1000
        values = (
            seen - submitted.timestamp(),
            compute_end - seen,
            yielded_at - compute_end - p["checkpoint_ms"] / 1000,
            p["checkpoint_ms"] / 1000,
            p["ended_at"].timestamp() - yielded_at,
            started.timestamp() - p["ended_at"].timestamp(),
        )
        for name, value in zip(PHASES, values, strict=True):
            split.phases[name].append(value * 1000)
    return split


def _after_yield(busy_slices: list[dict], rt_ids: list[int]) -> Counter:
    """What each GPU ran after a busy slice yielded: the RT job, the other busy job, or the same one again."""
    from clockq.jobs.models import Slice

    rt_slices = Slice.objects.filter(job_id__in=rt_ids).values("job_id", "gpu_index", "started_at")
    timeline = defaultdict(list)
    for s in (*busy_slices, *({**r, "outcome": "rt"} for r in rt_slices)):
        timeline[s["gpu_index"]].append(s)
    after_yield: Counter = Counter()
    for slices in timeline.values():
        slices.sort(key=lambda s: s["started_at"])
        for a, b in itertools.pairwise(slices):
            if a["outcome"] == "yielded":
                after_yield[
                    "RT job" if b["outcome"] == "rt" else "same job" if b["job_id"] == a["job_id"] else "other busy job"
                ] += 1
    return after_yield
