"""The dashboard's figures over a window, shaped for its charts: the queues every 5 s (the last
hour, clockq/jobs/queue_samples.py), the KPI rollup per minute (clockq/kpis/reports.py, so a
refresh never scans every Slice), and the load index, forecasts and control state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import redis

from clockq.control_state import control
from clockq.control_state.models import ControlState
from clockq.forecasting import forecasts
from clockq.jobs import queue_samples
from clockq.kpis import reports as kpis
from clockq.policy.kpis import WAIT_BUCKETS_MS


def plotly_time(moment: datetime) -> str:
    """UTC, as plotly.js reads a date (it ignores time zones)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def fine_series(*, since: datetime, until: datetime, tiers: list[str]) -> dict[str, Any] | None:
    """The queues every 5 s over the window (clockq/jobs/queue_samples.py): per tier code, jobs
    queued and the longest wait of a job not started yet; the load index. None for a window longer
    than the ring keeps: the page draws the minute series instead. `available` is False, with the
    reason, while the broker does not answer."""
    if not queue_samples.covers((until - since).total_seconds()):
        return None
    shape: dict[str, Any] = {"available": True, "step_s": queue_samples.STEP_S, "keep_s": queue_samples.KEEP_S}
    try:
        samples = queue_samples.queue_series(since, until)
    except redis.RedisError:
        samples = []
        shape.update(available=False, reason="the broker did not answer")
    return {
        **shape,
        "t": [plotly_time(s.at) for s in samples],
        "queued": {code: [s.queued.get(code) for s in samples] for code in tiers},
        "oldest_wait_s": {code: [s.oldest_wait_s.get(code) for s in samples] for code in tiers},
        "running": [s.running for s in samples],
        "gpus": [s.gpus for s in samples],
        "load_index": [s.load_index for s in samples],
    }


def kpi_charts(*, since: datetime, until: datetime) -> dict[str, Any] | None:
    """The rollup's figures for the window (clockq/kpis/reports.py), shaped for the charts; None
    before the first rollup."""
    window = kpis.summary(since, until)
    if window["rolled_up_until"] is None:
        return None
    over_time = kpis.series(since, until)
    tiers = {**window["tiers"], "all": window["overall"]}
    return {
        "since": plotly_time(over_time["since"]),
        "until": plotly_time(over_time["until"]),
        "rolled_up_until": plotly_time(window["rolled_up_until"]),
        "step_s": over_time["step_s"],
        "minutes": [plotly_time(t) for t in over_time["t"]],
        "queue_depth": over_time["queue_depth"],
        "gpus": [
            {"worker": worker, "gpu": gpu["gpu_index"], "busy": gpu["busy"], "util": gpu["util"]}
            for worker, gpu in over_time["gpus"].items()
        ],
        "waits": {
            code: {
                "started": kpi["started"],
                "counts": kpi["wait_histogram"]["counts"],
                "within_target": share_within(kpi["wait_histogram"]["counts"], kpi["wait_target_s"]),
                "mean_s": kpi["wait_mean_s"],
                "p95_s": kpi["wait_p95_s"],
            }
            for code, kpi in window["tiers"].items()
        },
        "rates": {
            code: {
                "judged": kpi["ended"]["succeeded"] + kpi["ended"]["failed"] + kpi["ended"]["timed_out"],
                "on_time": kpi["on_time_rate"],
                "timed_out": kpi["timeout_rate"],
            }
            for code, kpi in tiers.items()
        },
        "promotions": window["overall"]["promotions"],
        "switches": window["overall"]["switches"],
        "gpu_busy_share": window["gpus"]["busy_share"],
    }


def share_within(counts: list[int], target_s: float | None) -> float | None:
    """The share of waits in histogram `counts` that met a target. The buckets' bounds include
    every tier's target (clockq/policy/kpis.py), so this is exact for the tiers' own targets."""
    total = sum(counts)
    if not total or target_s is None:
        return None
    met = sum(n for bound, n in zip(WAIT_BUCKETS_MS, counts, strict=False) if bound <= target_s * 1000)
    return met / total


# --- load, forecasts and control ---------------------------------------------------------------


def load_and_control(*, since: datetime, now: datetime) -> dict[str, Any]:
    """The load index of the samples in the window; the forecasts made in it, each placed at the
    time it forecasts (made + horizon, so it lines up with the load it predicted); the latest
    forecast; the control state and the thresholds it acts on."""
    samples = forecasts.load_series(since, now)
    made = forecasts.forecast_series(since, now)
    latest = forecasts.latest_forecast()
    state = control.admission() if ControlState.objects.exists() else None
    t = control.thresholds()
    return {
        "samples": [{"t": plotly_time(s["at"]), "load": s["load_index"], "gpu_util": s["gpu_util"]} for s in samples],
        "forecasts": [
            {
                "made": plotly_time(f["at"]),
                "t": plotly_time(f["at"] + timedelta(seconds=f["horizon_s"])),
                "value": f["value"],
                "model": f["model"],
            }
            for f in made
        ],
        "latest": None
        if latest is None
        else {
            "made": plotly_time(latest.at),
            "t": plotly_time(latest.at + timedelta(seconds=latest.horizon_s)),
            "value": latest.value,
            "model": latest.model,
            "reason": latest.reason,
            "age_s": round((now - latest.at).total_seconds(), 1),
            "stale": (now - latest.at).total_seconds() > forecasts.STALE_AFTER_S,
        },
        "control": None
        if state is None
        else {
            "admission_open": state.admission_open,
            "prefetch_on": state.prefetch_on,
            "desired_workers": state.desired_workers,
            "reason": state.reason,
            "forecast": state.forecast,
            "forecast_at": plotly_time(state.forecast_at) if state.forecast_at else None,
            "forced": state.forced,
            "forced_by": state.forced_by,
        },
        "thresholds": {
            "close_above": t.close_above,
            "reopen_below": t.reopen_below,
            "scale_out_above": t.scale_out_above,
            "prefetch_below": t.prefetch_below,
        },
        "horizon_s": forecasts.HORIZON_S,
    }
