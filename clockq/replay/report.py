"""What a replay gives back, in numbers: one summary per policy, side by side as a table for a
terminal or as Markdown for the README, and the waits' CDFs as a chart.

The metrics, for one policy's replay of one trace (times in trace seconds):

- wait of a job: first_start_s - submit_s. A job that never started (it timed out while
  waiting) counts the time it waited until it was given up: finish_s - submit_s (the engine sets
  finish_s to the time of the timeout). A job that neither started nor ended has no wait and
  counts in ``unfinished``. Reported as mean and p95, over all jobs and per tier (the tiers
  present in the trace, in tier rank order), with the count of jobs per tier.
- p95 (and every quantile here): nearest rank, the smallest value such that at least 95 % of
  the values are at most it (always one of the values themselves).
- makespan: the last finish_s of any job - the first submit_s.
- GPU utilisation: busy_gpu_s / (gpus x makespan). Over a finite trace it also measures the
  drain after the last arrival: a policy that runs its longest job last ends later.
- utilisation in the arrival window: window_held_gpu_s / (gpus x window_s), the GPUs running
  jobs held between the first and the last submit, while the trace offers its load.
- GPU time idle while jobs wait: (gpus x waiting_s - held_while_waiting_gpu_s) / (gpus x
  makespan), the share of the capacity that sat free (or was switching) while some job waited:
  what a scheduler wastes, whatever the load (here: a gang waiting for enough GPUs at the head
  of the order, or GPUs coming back from a switch).
- switch overhead: switch_gpu_s / (gpus x makespan).
- timeout rate: timed-out jobs / all jobs.
- on-time rate: jobs that finished on time / all jobs, judged by
  clockq.policy.service_levels.finished_on_time, the same rule as the live KPIs: a job with a
  deadline is on time when it succeeded by the deadline; one without, when it succeeded and its
  wait for the first start (in whole ms, cut as the workers record it) stayed within its
  tier's wait target (a tier without a target: whenever it succeeded). A job given up before
  it started is never on time.
- JCT (job completion time): finish_s - submit_s over the jobs that succeeded; mean and p95.
- preemptions and promotions: totals over all jobs.
- events: the simulator's events; events per second: events / wall_s (the replay's own run
  time, a measure of the simulator, not of the policy).

A rate or mean of nothing (no jobs, no makespan, no wall time) is None, not 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from clockq.policy.service_levels import finished_on_time
from clockq.policy.tiers import TIERS, TierSpec
from clockq.replay.model import JobResult, RunResult

P95 = 0.95


# --- the arithmetic ----------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank q-quantile (0 < q <= 1) of `values`, None when there are none.

    (clockq.policy.kpis has only quantile_ms, which estimates from a bucketed histogram; a replay
    has every value, so it takes the exact one.)"""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"a quantile is above 0 and at most 1, not {q}")
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(part: float, whole: float | None) -> float | None:
    return part / whole if whole else None


def wait_s(result: JobResult) -> float | None:
    """The job's wait for its first start; for a job given up before it started, its wait until
    then. None for a job that neither started nor ended."""
    if result.first_start_s is not None:
        return result.first_start_s - result.job.submit_s
    if result.finish_s is not None:
        return result.finish_s - result.job.submit_s
    return None


def _tier_specs(codes: Iterable[str], tiers: Sequence[TierSpec]) -> list[TierSpec]:
    """The specs of `codes`, once each, in rank order. An unknown code is an error: judging its
    jobs against no target would call them on time."""
    by_code = {t.code: t for t in tiers}
    present = set(codes)
    unknown = sorted(present - by_code.keys())
    if unknown:
        raise ValueError(f"tier {', '.join(unknown)} is not one of {', '.join(by_code)}")
    return sorted((t for t in tiers if t.code in present), key=lambda t: t.rank)


def summarize(run: RunResult, tiers: Sequence[TierSpec] = TIERS) -> dict[str, Any]:
    """One policy's replay in numbers (see the module docstring); JSON-ready: rates are
    fractions 0..1, times are seconds, and a value that cannot be known is None."""
    jobs = run.jobs
    specs = _tier_specs((r.job.tier for r in jobs), tiers)
    target_ms = {t.code: t.wait_target_ms for t in specs}

    waits: list[float] = []
    tier_waits: dict[str, list[float]] = {t.code: [] for t in specs}
    tier_jobs = dict.fromkeys(tier_waits, 0)
    jcts: list[float] = []
    on_time = timed_out = unfinished = 0
    for r in jobs:
        tier_jobs[r.job.tier] += 1
        w = wait_s(r)
        if w is None:
            unfinished += 1
        else:
            waits.append(w)
            tier_waits[r.job.tier].append(w)
        timed_out += r.timed_out
        if r.jct_s is not None:
            jcts.append(r.jct_s)
        first_wait = r.wait_s  # the wait for a first start only: a job given up has none
        # finished_on_time judges trace seconds as it judges datetimes: one rule for the replay
        # and the live KPIs. The wait goes in whole ms, cut
        # the way the workers record first_wait_ms (workers/slice_runner.py), which also keeps
        # float noise (1.05 - 1.0 = 0.0500...04 s) from making a wait of exactly the target late.
        on_time += finished_on_time(
            succeeded=r.succeeded,
            finished_at=r.finish_s,
            deadline=r.job.deadline_s,
            first_wait_ms=None if first_wait is None else max(int(first_wait * 1000), 0),
            target_ms=target_ms[r.job.tier],
        )

    finishes = [r.finish_s for r in jobs if r.finish_s is not None]
    makespan = max(finishes) - min(r.job.submit_s for r in jobs) if finishes else None
    capacity = run.gpus * makespan if makespan is not None else None
    n = len(jobs)
    return {
        "policy": run.policy,
        "gpus": run.gpus,
        "jobs": n,
        "succeeded": sum(r.succeeded for r in jobs),
        "timed_out": timed_out,
        "on_time": on_time,
        "unfinished": unfinished,
        "wait_mean_s": mean(waits),
        "wait_p95_s": quantile(waits, P95),
        "tiers": {
            spec.code: {
                "rank": spec.rank,
                "jobs": tier_jobs[spec.code],
                "wait_mean_s": mean(tier_waits[spec.code]),
                "wait_p95_s": quantile(tier_waits[spec.code], P95),
            }
            for spec in specs
        },
        "gpu_utilisation": _ratio(run.busy_gpu_s, capacity),
        "switch_overhead": _ratio(run.switch_gpu_s, capacity),
        "window_utilisation": _ratio(run.window_held_gpu_s, run.gpus * run.window_s),
        "idle_while_waiting": _ratio(run.gpus * run.waiting_s - run.held_while_waiting_gpu_s, capacity),
        "timeout_rate": _ratio(timed_out, n),
        "on_time_rate": _ratio(on_time, n),
        "jct_mean_s": mean(jcts),
        "jct_p95_s": quantile(jcts, P95),
        "makespan_s": makespan,
        "busy_gpu_s": run.busy_gpu_s,
        "switch_gpu_s": run.switch_gpu_s,
        "preemptions": sum(r.preemptions for r in jobs),
        "promotions": sum(r.promotions for r in jobs),
        "held_jobs": run.held_jobs,
        "admission_closures": run.admission_closures,
        "events": run.events,
        "events_per_s": _ratio(run.events, run.wall_s),
        "wall_s": run.wall_s,
    }


# --- the tables --------------------------------------------------------------------------------

NONE = "-"


def human_s(seconds: float | None) -> str:
    """A duration in the unit that reads best: 850 ms, 12 s, 3.8 min, 2.1 h, 4.5 d."""
    if seconds is None:
        return NONE
    if seconds < 0:
        return "-" + human_s(-seconds)
    if seconds == 0:
        return "0 s"
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("min", 60.0)):
        # from 2 d, 2 h: "36 h" reads better than "1.5 d", "90 min" worse than "1.5 h"
        if seconds >= (2 * size if unit == "d" else size):
            return f"{seconds / size:.1f} {unit}"
    if seconds >= 1:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    ms = seconds * 1000
    return f"{ms:.2g} ms" if ms < 10 else f"{ms:.0f} ms"


def human_pct(fraction: float | None) -> str:
    if fraction is None:
        return NONE
    pct = fraction * 100
    return f"{pct:.2g}%" if 0 < abs(pct) < 0.1 else f"{pct:.1f}%"


def human_n(n: float | None) -> str:
    return NONE if n is None else f"{n:,.0f}"


Row = tuple[str, Callable[[dict[str, Any]], str]]


def _rows(summaries: Sequence[dict[str, Any]]) -> list[Row]:
    def tier_value(code: str, key: str, fmt: Callable[[Any], str]) -> Callable[[dict[str, Any]], str]:
        return lambda s: fmt(s["tiers"][code][key]) if code in s["tiers"] else NONE

    ranks: dict[str, int] = {}
    for s in summaries:
        for code, tier in s["tiers"].items():
            ranks.setdefault(code, tier["rank"])
    rows: list[Row] = [
        ("jobs", lambda s: human_n(s["jobs"])),
        ("GPUs", lambda s: human_n(s["gpus"])),
        ("mean wait", lambda s: human_s(s["wait_mean_s"])),
        ("p95 wait", lambda s: human_s(s["wait_p95_s"])),
    ]
    for code in sorted(ranks, key=lambda c: (ranks[c], c)):
        rows += [
            (f"{code} jobs", tier_value(code, "jobs", human_n)),
            (f"{code} mean wait", tier_value(code, "wait_mean_s", human_s)),
            (f"{code} p95 wait", tier_value(code, "wait_p95_s", human_s)),
        ]
    rows += [
        ("GPU utilisation", lambda s: human_pct(s["gpu_utilisation"])),
        ("switch overhead", lambda s: human_pct(s["switch_overhead"])),
        ("utilisation in the arrival window", lambda s: human_pct(s.get("window_utilisation"))),
        ("GPU time idle while jobs wait", lambda s: human_pct(s.get("idle_while_waiting"))),
        ("timeout rate", lambda s: human_pct(s["timeout_rate"])),
        ("on-time rate", lambda s: human_pct(s["on_time_rate"])),
        ("mean JCT", lambda s: human_s(s["jct_mean_s"])),
        ("p95 JCT", lambda s: human_s(s["jct_p95_s"])),
        ("makespan", lambda s: human_s(s["makespan_s"])),
        ("preemptions", lambda s: human_n(s["preemptions"])),
        ("promotions", lambda s: human_n(s["promotions"])),
    ]
    if any(s.get("admission_closures") for s in summaries):  # only where admission control closed
        rows += [
            ("jobs held by admission", lambda s: human_n(s.get("held_jobs", 0))),
            ("admission closures", lambda s: human_n(s.get("admission_closures", 0))),
        ]
    return rows


def _grid(summaries: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows of cells): a metric per row, a policy per column."""
    if not summaries:
        raise ValueError("no summaries to tabulate")
    same_gpus = len({s["gpus"] for s in summaries}) == 1
    header = ["metric"] + [s["policy"] if same_gpus else f"{s['policy']} ({s['gpus']} GPUs)" for s in summaries]
    return header, [[label] + [cell(s) for s in summaries] for label, cell in _rows(summaries)]


def table(summaries: list[dict[str, Any]]) -> str:
    """The policies side by side, as plain text for a terminal."""
    header, rows = _grid(summaries)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first, rest = cells[0].ljust(widths[0]), [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)]) + "\n"


def markdown(summaries: list[dict[str, Any]]) -> str:
    """The same table in Markdown, for the README."""
    header, rows = _grid(summaries)

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join([" --- "] + [" ---: "] * (len(header) - 1)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)]) + "\n"


# --- the chart ---------------------------------------------------------------------------------

# A log axis cannot show 0: shorter waits (a job that started at once) are drawn at this floor.
PLOT_FLOOR_S = 1e-3
PLOT_POINTS = 2_000  # at most this many points per curve: a trace of 100 000 jobs stays small
PLOT_SUFFIXES = (".html", ".png")


def _cdf(waits: Sequence[float]) -> tuple[list[float], list[float]]:
    """The empirical CDF's steps (wait, share of jobs waiting at most that), thinned to at most
    PLOT_POINTS, always keeping the last; from 0 at the shortest wait, so that even one job
    draws its step."""
    ordered = sorted(max(w, PLOT_FLOOR_S) for w in waits)
    n = len(ordered)
    if not n:
        return [], []
    if n <= PLOT_POINTS:
        picks = list(range(n))
    else:
        picks = sorted({round(i * (n - 1) / (PLOT_POINTS - 1)) for i in range(PLOT_POINTS)})
    return [ordered[0]] + [ordered[i] for i in picks], [0.0] + [(i + 1) / n for i in picks]


def _panels(runs: Sequence[RunResult], tiers: Sequence[TierSpec]) -> list[tuple[str, list[tuple[str, list[float]]]]]:
    """(title, [(policy, waits)]) for all jobs, then for each tier present, in rank order."""
    specs = _tier_specs({r.job.tier for run in runs for r in run.jobs}, tiers)
    panels = [("all jobs", [(run.policy, [w for r in run.jobs if (w := wait_s(r)) is not None]) for run in runs])]
    for spec in specs:
        curves = []
        for run in runs:
            waits = [w for r in run.jobs if r.job.tier == spec.code and (w := wait_s(r)) is not None]
            curves.append((run.policy, waits))
        panels.append((f"{spec.code} ({spec.use})", curves))
    return panels


def plot(runs: list[RunResult], path: str, tiers: Sequence[TierSpec] = TIERS) -> None:
    """The waits' CDFs, one panel for all jobs and one per tier, a curve per policy; written to
    `path`: .html (plotly, with plotly.js inlined so that it opens offline) or .png
    (matplotlib, Agg). Waits under PLOT_FLOOR_S are drawn at it (the wait axis is logarithmic)."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ValueError(f"{path}: a chart is written as {' or '.join(PLOT_SUFFIXES)}, not {suffix or 'no suffix'}")
    if not runs:
        raise ValueError("no runs to plot")
    panels = _panels(runs, tiers)
    if suffix == ".html":
        _plot_html(panels, path)
    else:
        _plot_png(panels, path)


X_TITLE = "wait (s, log scale; under 1 ms drawn at 1 ms)"
Y_TITLE = "share of jobs"
TITLE = "Wait for the first start, by policy"


def _plot_html(panels: list[tuple[str, list[tuple[str, list[float]]]]], path: str) -> None:
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[title for title, _ in panels])
    palette = qualitative.Plotly
    for p, (_, curves) in enumerate(panels):
        row, col = divmod(p, cols)
        for c, (policy, waits) in enumerate(curves):
            x, y = _cdf(waits)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    line={"shape": "hv", "color": palette[c % len(palette)]},
                    name=policy,
                    legendgroup=policy,
                    showlegend=p == 0,
                ),
                row=row + 1,
                col=col + 1,
            )
        fig.update_xaxes(type="log", title_text=X_TITLE, row=row + 1, col=col + 1)
        fig.update_yaxes(range=[0, 1.02], title_text=Y_TITLE, row=row + 1, col=col + 1)
    fig.update_layout(title_text=TITLE, height=340 * rows, template="plotly_white")
    fig.write_html(path, include_plotlyjs=True, full_html=True)


def _plot_png(panels: list[tuple[str, list[tuple[str, list[float]]]]], path: str) -> None:
    # The Figure with its own Agg canvas, not pyplot: no global backend to switch, no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5 * cols, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    for p, (title, curves) in enumerate(panels):
        ax = axes[divmod(p, cols)]
        for c, (policy, waits) in enumerate(curves):
            x, y = _cdf(waits)
            if x:
                ax.step(x, y, where="post", color=f"C{c % 10}", label=policy)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_title(title)
        ax.set_xlabel(X_TITLE)
        ax.set_ylabel(Y_TITLE)
        ax.grid(True, alpha=0.3)
    for p in range(len(panels), rows * cols):
        axes[divmod(p, cols)].set_visible(False)
    fig.suptitle(TITLE)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        axes[0, 0].legend(handles, labels, loc="lower right")
    fig.savefig(path, dpi=100)
