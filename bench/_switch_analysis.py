"""The analysis behind bench/switch_cost.py: switches found in the Slice and JobEvent rows and
the Celery task events, split into phases, and the report (see that module's docstring)."""

from __future__ import annotations

import ast
import bisect
import itertools
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from _harness import Summary, filesystem_of

HALF_MS_TRUNCATION = 0.5  # Slice.used_ms is stored as int(ms)

CLOCKQ_PHASES = ("decide", "checkpoint", "record", "commit", "fetch", "claim", "start", "restore")
BARE_PHASES = ("publish", "return", "fetch", "to child")


@dataclass
class Measured:
    label: str
    totals: list[float]  # ms, one per switch or hop
    phases: dict[str, list[float]]  # ms, only for switches whose Celery events were all seen
    notes: list[str]


@dataclass
class Probed:
    """The probe run: clockq's app with timers in the pool child (bench/_probe_app.py)."""

    state_kb: int
    switches: list[SwitchTimes]
    records: list[tuple[str, float, float]]  # (kind, start wall s, duration s), by start


@dataclass
class CeleryTask:
    args: list | None
    received: float | None = None
    succeeded: float | None = None


def celery_tasks(events: list[dict], name: str) -> list[CeleryTask]:
    """One entry per task id, for the task `name`, with its event timestamps."""
    tasks: dict[str, CeleryTask] = {}
    for event in events:
        task = tasks.setdefault(event["uuid"], CeleryTask(None))
        if event["type"] == "task-received":
            if event.get("name") != name:
                tasks.pop(event["uuid"])
                continue
            task.received = event["timestamp"]
            try:
                task.args = list(ast.literal_eval(event.get("args") or "()"))
            except (ValueError, SyntaxError):
                task.args = None
        elif event["type"] == "task-succeeded":
            task.succeeded = event["timestamp"]
    return [t for t in tasks.values() if t.received is not None]


@dataclass(frozen=True)
class SwitchTimes:
    """The moments of one switch from job A to job B (wall-clock seconds); see the docstring."""

    compute_end: float
    yielded_at: float
    a_ended: float
    a_succeeded: float | None  # Celery task-succeeded of A's task
    b_received: float | None  # Celery task-received of B's task
    claimed_at: float
    b_started: float
    compute_start: float
    checkpoint_ms: float

    @property
    def total_ms(self) -> float:
        return ms(self.compute_start - self.compute_end)

    def phases(self) -> tuple[float, ...] | None:
        """The CLOCKQ_PHASES in ms, or None when A's or B's Celery events were not seen."""
        if self.a_succeeded is None or self.b_received is None:
            return None
        return (
            ms(self.yielded_at - self.compute_end) - self.checkpoint_ms,
            self.checkpoint_ms,
            ms(self.a_ended - self.yielded_at),
            ms(self.a_succeeded - self.a_ended),
            ms(self.b_received - self.a_succeeded),
            ms(self.claimed_at - self.b_received),
            ms(self.b_started - self.claimed_at),
            ms(self.compute_start - self.b_started),
        )

    def handover_intervals(self) -> list[tuple[str, float, float]]:
        """The phases of a hand-over (no Celery hop, so no task events): A's decision and
        snapshot, its records, then from A's slice written to B's claim (COMMIT, the order's
        read, B's CAS), B's start, and B's restore."""
        marks = (self.compute_end, self.yielded_at, self.a_ended, self.claimed_at, self.b_started, self.compute_start)
        return list(zip(HANDOVER_PHASES, marks, marks[1:], strict=False))

    def intervals(self) -> list[tuple[str, float, float]]:
        """Consecutive phase intervals, with decide and checkpoint as one."""
        assert self.a_succeeded is not None and self.b_received is not None
        marks = (
            self.compute_end,
            self.yielded_at,
            self.a_ended,
            self.a_succeeded,
            self.b_received,
            self.claimed_at,
            self.b_started,
            self.compute_start,
        )
        names = ("decide+checkpoint", *CLOCKQ_PHASES[2:])
        return [(name, lo, hi) for name, lo, hi in zip(names, marks, marks[1:], strict=False)]


def find_switches(
    slices: list[dict], job_events: list[tuple], tasks: list[CeleryTask], warmup: int, notes: list[str]
) -> list[SwitchTimes]:
    """Every switch after the warm-up: a yielded slice followed by another job's slice."""
    yields: dict[int, list[float]] = defaultdict(list)
    claims: dict[int, list[float]] = defaultdict(list)
    for job_id, src, dst, at in job_events:
        if (src, dst) == ("running", "queued"):
            yields[job_id].append(at.timestamp())
        elif (src, dst) == ("queued", "running"):
            claims[job_id].append(at.timestamp())
    for times in (*yields.values(), *claims.values()):
        times.sort()
    received: dict[int, list[CeleryTask]] = defaultdict(list)
    for task in sorted(tasks, key=lambda t: t.received):
        received[task.args[0]].append(task)

    found: list[SwitchTimes] = []
    skipped = 0
    pairs = [(a, b) for a, b in itertools.pairwise(slices) if a["outcome"] == "yielded" and a["job_id"] != b["job_id"]]
    for a, b in pairs[warmup:]:
        a_start, a_end, b_start = a["started_at"].timestamp(), a["ended_at"].timestamp(), b["started_at"].timestamp()
        yielded_at = first_between(yields[a["job_id"]], a_start, a_end)
        claimed_at = last_between(claims[b["job_id"]], a_end, b_start)
        if yielded_at is None or claimed_at is None:
            skipped += 1
            continue
        task_a = last_task_between(received[a["job_id"]], 0.0, a_start)
        task_b = last_task_between(received[b["job_id"]], a_end, b_start)
        found.append(
            SwitchTimes(
                compute_end=a_start + (a["restore_ms"] + a["used_ms"] + HALF_MS_TRUNCATION) / 1000,
                yielded_at=yielded_at,
                a_ended=a_end,
                a_succeeded=task_a.succeeded if task_a else None,
                b_received=task_b.received if task_b else None,
                claimed_at=claimed_at,
                b_started=b_start,
                compute_start=b_start + b["restore_ms"] / 1000,
                checkpoint_ms=a["checkpoint_ms"],
            )
        )
    if skipped:
        notes.append(f"{skipped} switch(es) skipped: their job events were not found")
    return found


def measure(label: str, switches: list[SwitchTimes], notes: list[str]) -> Measured:
    phases: dict[str, list[float]] = defaultdict(list)
    for switch in switches:
        values = switch.phases()
        if values is not None:
            for name, value in zip(CLOCKQ_PHASES, values, strict=True):
                phases[name].append(value)
    return Measured(label, [s.total_ms for s in switches], dict(phases), notes)


def first_between(times: list[float], lo: float, hi: float) -> float | None:
    i = bisect.bisect_left(times, lo)
    return times[i] if i < len(times) and times[i] <= hi else None


def last_between(times: list[float], lo: float, hi: float) -> float | None:
    i = bisect.bisect_right(times, hi)
    return times[i - 1] if i > 0 and times[i - 1] >= lo else None


def last_task_between(tasks: list[CeleryTask], lo: float, hi: float) -> CeleryTask | None:
    found = None
    for task in tasks:
        if task.received > hi:
            break
        if task.received >= lo:
            found = task
    return found


def ms(seconds: float) -> float:
    return seconds * 1000.0


# --- report ---------------------------------------------------------------------------------


def report(
    args,
    work: Path,
    rounds: list[tuple[Measured, list[Measured]]],
    probed: Probed | None,
    notes: list[str],
    elapsed_s: float,
) -> None:
    """The tables pool every round's hops and switches; the ratio is the median of the rounds'."""
    import celery
    import django

    print(
        f"clockq slice switch vs bare Celery hop: one worker (prefork, concurrency 1), private redis-server, "
        f"SQLite; SP slice {args.slice_ms} ms; {os.cpu_count()} CPUs; checkpoints on "
        f"{filesystem_of(work.parent)}; Python {sys.version.split()[0]}, Celery {celery.__version__}, "
        f"Django {django.__version__}; {elapsed_s:.0f} s"
    )
    for note in notes:
        print(f"note: {note}")
    print()
    bare = _pooled([b for b, _ in rounds])
    runs = [_pooled([r[0] for _, r in rounds]), *rounds[-1][1][1:]]
    print(f"{'ms':<34}{'n':>6}{'median':>9}{'p90':>9}{'p99':>9}{'mean':>9}")
    for measured, names in ((bare, BARE_PHASES), *((run, CLOCKQ_PHASES) for run in runs)):
        print(row(measured.label, Summary.of(measured.totals)))
        for name in names:
            if name in measured.phases:
                print(row(f"  {name}", Summary.of(measured.phases[name])))
        for note in measured.notes:
            print(f"  ({note})")
        print()

    if probed is not None:
        report_probe(probed)
        print()
    ratios = []
    print(f"{'round':<8}{'bare hop median':>17}{'switch median':>15}{'ratio':>8}{'p99 ratio':>11}")
    for i, (bare_i, runs_i) in enumerate(rounds, 1):
        for measured in (runs_i[0], bare_i):
            if len(measured.totals) < args.switches:
                print(f"warning: round {i}: {measured.label}: only {len(measured.totals)} of {args.switches} measured")
        hop_i, switch_i = Summary.of(bare_i.totals), Summary.of(runs_i[0].totals)
        ratios.append((switch_i.median / hop_i.median, switch_i.p99 / hop_i.p99))
        print(f"{i:<8}{hop_i.median:>17.2f}{switch_i.median:>15.2f}{ratios[-1][0]:>8.2f}{ratios[-1][1]:>11.2f}")
    switch, hop = Summary.of(runs[0].totals), Summary.of(bare.totals)
    print(
        f"switch ({args.state_kb} KB) median {switch.median:.2f} ms p99 {switch.p99:.2f} ms | "
        f"bare hop median {hop.median:.2f} ms p99 {hop.p99:.2f} ms | "
        f"ratio median {statistics.median(r for r, _ in ratios):.2f} p99 {statistics.median(p for _, p in ratios):.2f} "
        f"(median of {len(rounds)} rounds)"
    )


def _pooled(measured: list[Measured]) -> Measured:
    phases: dict[str, list[float]] = defaultdict(list)
    for m in measured:
        for name, values in m.phases.items():
            phases[name] += values
    totals = [t for m in measured for t in m.totals]
    return Measured(measured[0].label, totals, dict(phases), measured[-1].notes)


PROBE_KINDS = ("sql", "commit", "connect", "close", "redis")
HANDOVER_PHASES = ("decide+checkpoint", "record", "hand over", "start", "restore")


def report_probe(probed: Probed) -> None:
    """Where the time goes inside each phase: timed SQL, COMMIT, connect, close and Redis calls.

    Means per switch, so that the columns and rows add up; `other` is the phase's span less the
    timed calls: Python, Django, Celery and logging work, file I/O, and waiting for the CPU."""
    starts = [r[1] for r in probed.records]
    switches = [s for s in probed.switches if s.a_succeeded is not None and s.b_received is not None]
    handovers = not switches  # the same worker took B at once: no Celery hop, no task events
    if handovers:
        switches = list(probed.switches)
    if not switches or not starts:
        print("probe: no switches with probe records")
        return
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for switch in switches:
        for name, lo, hi in switch.handover_intervals() if handovers else switch.intervals():
            row_sums = sums[name]
            row_sums["span"] += ms(hi - lo)
            for kind, start, duration in probed.records[
                bisect.bisect_left(starts, lo) : bisect.bisect_left(starts, hi)
            ]:
                if kind in PROBE_KINDS:
                    row_sums[kind] += ms(duration)
                    row_sums[f"n {kind}"] += 1
                elif kind == "prerun" and name == "claim":
                    row_sums["to child"] += ms(start - lo)
                elif kind == "postrun" and name == "commit":
                    row_sums["after body"] += ms(hi - start)
    total: dict[str, float] = defaultdict(float)
    for row_sums in sums.values():
        for key, value in row_sums.items():
            total[key] += value
    sums["whole switch"] = total

    n = len(switches)
    median = Summary.of([s.total_ms for s in switches]).median
    print(
        f"probe: GPU worker with timers (-A bench._probe_app), {probed.state_kb} KB state, {n} switches, "
        f"switch median {median:.2f} ms"
    )
    print(f"{'mean ms per switch':<20}{'span':>7}{'sql':>7}{'(n)':>5}{'commit':>8}{'connect':>8}{'close':>7}", end="")
    print(f"{'redis':>7}{'(n)':>5}{'other':>7}")
    for name in (
        (*HANDOVER_PHASES, "whole switch") if handovers else ("decide+checkpoint", *CLOCKQ_PHASES[2:], "whole switch")
    ):
        r = {key: value / n for key, value in sums[name].items()}
        r = defaultdict(float, r)
        other = r["span"] - sum(r[kind] for kind in PROBE_KINDS)
        print(
            f"{name:<20}{r['span']:>7.2f}{r['sql']:>7.2f}{r['n sql']:>5.1f}{r['commit']:>8.2f}{r['connect']:>8.2f}"
            f"{r['close']:>7.2f}{r['redis']:>7.2f}{r['n redis']:>5.1f}{other:>7.2f}"
        )
    if handovers:
        print("  (hand-overs: 'hand over' runs from A's slice record to B's claim: COMMIT, the order's read, B's CAS)")
    else:
        print(
            f"  (commit: {total['after body'] / n:.2f} ms of it after the task body returned: result to the pool's "
            f"parent, ack; claim: {total['to child'] / n:.2f} ms of it before the task body started: message to the "
            f"pool child, trace setup)"
        )
    report_probe_functions(probed, switches, starts)


def report_probe_functions(probed: Probed, switches: list[SwitchTimes], starts: list[float]) -> None:
    """Time inside the timed functions and log calls during each switch. Nested, so not additive."""
    totals: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for switch in switches:
        # A's boundary starts as its compute ends, which is known to +-0.5 ms: look from 1 ms before.
        lo, hi = switch.compute_end - 0.001, switch.compute_start
        for kind, _start, duration in probed.records[bisect.bisect_left(starts, lo) : bisect.bisect_left(starts, hi)]:
            if kind not in PROBE_KINDS and kind not in ("prerun", "postrun"):
                totals[kind] += ms(duration)
                calls[kind] += 1
    n = len(switches)
    print(f"{'timed calls in a switch (nested, mean per switch)':<52}{'ms':>7}{'calls':>7}")
    for kind in sorted(totals, key=lambda k: -totals[k]):
        print(f"  {kind:<50}{totals[kind] / n:>7.2f}{calls[kind] / n:>7.1f}")
    for kind in sorted({r[0] for r in probed.records if r[0].startswith("missing ")}):
        print(f"  ({kind}: not timed)")


def row(label: str, s: Summary) -> str:
    return f"{label:<34}{s.n:>6}{s.median:>9.2f}{s.p90:>9.2f}{s.p99:>9.2f}{s.mean:>9.2f}"
