"""The simulator against live, as a JSON-ready dict: start order (Kendall's tau), waits,
utilisation, end states, switches, each job side by side, and what /api/kpis said."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.live_replay.plan import LivePlan
from bench.live_replay.readback import LiveJob
from clockq.policy.tiers import TIERS
from clockq.replay.model import RunResult


def kendall(order_a: Sequence[str], order_b: Sequence[str]) -> dict[str, Any]:
    """How two start orders agree, over the jobs that appear in both: the pairs in a different
    order (discordant), and Kendall's tau = (concordant - discordant) / pairs (None: < 2 jobs)."""
    pos_b = {k: i for i, k in enumerate(order_b)}
    common = [k for k in order_a if k in pos_b]
    n = len(common)
    discordant = sum(1 for i in range(n) for j in range(i + 1, n) if pos_b[common[i]] > pos_b[common[j]])
    pairs = n * (n - 1) // 2
    return {
        "jobs": n,
        "pairs": pairs,
        "discordant": discordant,
        "kendall_tau": None if pairs == 0 else (pairs - 2 * discordant) / pairs,
    }


def compare(
    plan: LivePlan,
    sim: RunResult,
    live: Sequence[LiveJob],
    *,
    gpus: int,
    kpis: dict[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """Simulator against live, as a JSON-ready dict (render() prints it). Live times are in
    seconds from the first job's planned submission, by the server's clock: origin = the
    earliest submitted_at - planned submit time (the job sent with the least lag)."""
    if not live:
        raise ValueError("no live jobs to compare")
    origin = min(j.submitted_at - timedelta(seconds=j.planned_s) for j in live)
    live_order = [key for _, key in sorted((j.first_start, j.key) for j in live if j.first_start is not None)]
    per_job = _per_job(plan, sim, live, live_order, origin)
    live_first = min(_secs(origin, j.submitted_at) for j in live)
    live_last = max((_secs(origin, j.finished_at) for j in live if j.finished_at), default=live_first)
    submit_lags = [row["live_submit_s"] - row["submit_s"] for row in per_job if row["live_submit_s"] is not None]
    return {
        "trace": plan.trace.name,
        "jobs": len(plan.trace.jobs),
        "gpus": gpus,
        "compress": plan.compress,
        "step_ms": plan.step_ms,
        "state_kb_cap": plan.state_kb_cap,
        "multi_gpu_jobs": plan.multi_gpu_jobs,
        "capped_state_jobs": plan.capped_state_jobs,
        "start_order": _start_order(sim, live_order, per_job),
        "wait_mean_s": _wait_means(sim, per_job),
        "jct_mean_s": _jct_means(per_job),
        "utilisation": {
            "sim": _sim_utilisation(plan, sim, gpus),
            "live": _live_utilisation(live, gpus, live_last - live_first),
        },
        "states": {
            "sim": dict(Counter(row["sim_state"] for row in per_job)),
            "live": dict(Counter(row["live_state"] for row in per_job)),
        },
        "rungs": _rungs(plan, live),
        "switches": {
            "sim_preemptions": sum(r.preemptions for r in sim.jobs),
            "live_yields": sum(j.yields for j in live),
            "sim_promotions": sum(r.promotions for r in sim.jobs),
            "live_promotions": sum(j.promotions for j in live),
            "live_holds": sum(j.holds for j in live),
        },
        "submit_lag_s": {"mean": _mean(submit_lags), "max": max(submit_lags, default=None)},
        "live_window": {"since": _iso(origin), "until": _iso(origin + timedelta(seconds=live_last))},
        "kpis": _kpi_digest(kpis, {tj.tier for tj in plan.trace.jobs}),
        "per_job": per_job,
        "warnings": [*warnings, *_hold_warnings(live)],
        "mapping": list(plan.trace.mapping),
    }


def _per_job(
    plan: LivePlan, sim: RunResult, live: Sequence[LiveJob], live_order: list[str], origin: datetime
) -> list[dict[str, Any]]:
    """Each job of the converted trace, simulated and live side by side, in trace order."""
    by_key = {j.key: j for j in live}
    sim_by_key = {r.job.key: r for r in sim.jobs}
    sim_pos = {k: i + 1 for i, k in enumerate(sim.start_order)}
    live_pos = {k: i + 1 for i, k in enumerate(live_order)}
    rows: list[dict[str, Any]] = []
    for tj in plan.trace.jobs:
        r, lj = sim_by_key[tj.key], by_key.get(tj.key)
        rows.append(
            {
                "key": tj.key,
                "id": lj.id if lj else None,
                "tier": tj.tier,
                "submit_s": tj.submit_s,
                "live_submit_s": _rel(origin, lj.submitted_at) if lj else None,
                "sim_start_s": r.first_start_s,
                "live_start_s": _rel(origin, lj.first_start) if lj else None,
                "sim_wait_s": r.wait_s,
                "live_wait_s": lj.wait_s if lj else None,
                "sim_pos": sim_pos.get(tj.key),
                "live_pos": live_pos.get(tj.key),
                "sim_finish_s": r.finish_s,
                "live_finish_s": _rel(origin, lj.finished_at) if lj else None,
                "sim_state": "timed_out" if r.timed_out else "succeeded" if r.succeeded else "unfinished",
                "live_state": lj.state if lj else "not submitted",
                "sim_preemptions": r.preemptions,
                "live_yields": lj.yields if lj else None,
                "sim_promotions": r.promotions,
                "live_promotions": lj.promotions if lj else None,
            }
        )
    return rows


def _start_order(sim: RunResult, live_order: list[str], per_job: list[dict[str, Any]]) -> dict[str, Any]:
    order = kendall(sim.start_order, live_order)
    order["same"] = sim.start_order == live_order
    order["sim"] = list(sim.start_order)
    order["live"] = live_order
    order["not_started"] = {
        "sim": [r.job.key for r in sim.jobs if r.first_start_s is None],
        "live": [row["key"] for row in per_job if row["live_start_s"] is None],
    }
    return order


def _hold_warnings(live: Sequence[LiveJob]) -> list[str]:
    """Live holds have no counterpart in the simulator (it runs without admission control): a
    held job's wait includes its hold, and the comparison no longer compares the order."""
    held = [j.key for j in live if j.holds]
    if not held:
        return []
    return [
        f"{len(held)} live job(s) were held (admission closed, or an operator's hold), which the simulator "
        f"does not do: {' '.join(held[:20])}{' ...' if len(held) > 20 else ''}. For a live replay, start the "
        "cluster with admission control that cannot close (CLOCKQ_ADMISSION_CLOSE_ABOVE=100)"
    ]


def _rungs(plan: LivePlan, live: Sequence[LiveJob]) -> dict[str, Any]:
    """The ladder both sides ran, and how many jobs passed their tier's first rung: in the
    simulator by run time, live by the service the slices recorded (a live job computes a little
    longer than its steps, so a job just short of a rung may cross it live only)."""
    rank = {t.code: t.rank for t in TIERS}
    tier = {tj.key: tj.tier for tj in plan.trace.jobs}
    first = {key: plan.ladder.rungs(rank[code])[0] for key, code in tier.items()}
    return {
        "ladder_s": list(plan.ladder.base_gpu_s),
        "sim_past_first_rung": plan.past_first_rung(),
        "live_past_first_rung": sum(1 for j in live if j.busy_s >= first[j.key]),
    }


def _wait_means(sim: RunResult, per_job: list[dict[str, Any]]) -> dict[str, Any]:
    sim_waits = [w for w in (r.wait_s for r in sim.jobs) if w is not None]
    live_waits = [row["live_wait_s"] for row in per_job if row["live_wait_s"] is not None]
    sim_mean, live_mean = _mean(sim_waits), _mean(live_waits)
    return {
        "sim": sim_mean,
        "live": live_mean,
        "diff": None if sim_mean is None or live_mean is None else live_mean - sim_mean,
        "sim_started": len(sim_waits),
        "live_started": len(live_waits),
    }


def _jct_means(per_job: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean completion time (submit to end) over the jobs that succeeded on both sides: with the
    order by attained service, a short job passes a long one, and this is where it shows."""
    both = [r for r in per_job if r["sim_state"] == "succeeded" and r["live_state"] == "succeeded"]
    sim_mean = _mean([r["sim_finish_s"] - r["submit_s"] for r in both])
    live_mean = _mean([r["live_finish_s"] - r["live_submit_s"] for r in both])
    return {"sim": sim_mean, "live": live_mean, "jobs": len(both)}


def _sim_utilisation(plan: LivePlan, sim: RunResult, gpus: int) -> dict[str, Any]:
    """From the first submission to the last end: computing, and computing or switching."""
    first = min(tj.submit_s for tj in plan.trace.jobs)
    last = max((r.finish_s for r in sim.jobs if r.finish_s is not None), default=first)
    span = last - first
    return {
        "busy": _ratio(sim.busy_gpu_s, gpus * span),
        "held": _ratio(sim.busy_gpu_s + sim.switch_gpu_s, gpus * span),
        "span_s": span,
    }


def _live_utilisation(live: Sequence[LiveJob], gpus: int, span: float) -> dict[str, Any]:
    """Computing (the slices' used_ms) and holding a GPU (their wall time; None if any job's
    history was capped), over the live span."""
    helds = [j.held_s for j in live]
    held = None if any(h is None for h in helds) else sum(h for h in helds if h is not None)
    return {
        "busy": _ratio(sum(j.busy_s for j in live), gpus * span),
        "held": None if held is None else _ratio(held, gpus * span),
        "span_s": span,
    }


def _kpi_digest(kpis: dict[str, Any] | None, tiers: set[str]) -> dict[str, Any] | None:
    """What /api/kpis says about waits (and GPU busy share), for the tiers in the trace."""
    if kpis is None:
        return None
    if "error" in kpis:
        return {"error": kpis["error"]}

    def waits(t: dict[str, Any]) -> dict[str, Any]:
        return {k: t.get(k) for k in ("started", "wait_mean_s", "wait_p95_s", "late")}

    return {
        "since": kpis.get("since"),
        "until": kpis.get("until"),
        "rolled_up_until": kpis.get("rolled_up_until"),
        "covered": kpis.get("covered", False),
        "overall": waits(kpis.get("overall") or {}),
        "tiers": {code: waits(t) for code, t in (kpis.get("tiers") or {}).items() if code in tiers},
        "gpu_busy_share": (kpis.get("gpus") or {}).get("busy_share"),
    }


def _secs(origin: datetime, t: datetime) -> float:
    return (t - origin).total_seconds()


def _rel(origin: datetime, t: datetime | None) -> float | None:
    return None if t is None else _secs(origin, t)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()
