"""The control rules: what a load forecast does to admission, prefetch and the worker count.

The forecast is the load index expected 15 minutes ahead (0 idle, 1 every GPU spoken for; it may
exceed 1 when more is waiting than the GPUs can take). These functions take it with the current
state and return decisions, each with a reason that names the forecast and the threshold; a
service in the core (clockq/control_state/control.py) writes them.

- **Admission** closes above `close_above` (85%) and reopens only below `reopen_below` (75% by
  default). Between the two the state stays as it is, so a forecast wandering around 85%
  changes admission once, not at every forecast.
- **Prefetch** turns on below `prefetch_below` (30%) and off again only above
  `prefetch_off_above` (35%): the same kind of band, narrower, because a wrong prefetch decision
  costs little (some disk and bandwidth), a wrong admission decision a lot.
- **Desired GPU workers**: above `scale_out_above` (70%), enough workers to bring the forecast
  back to 70% (`ceil(workers * forecast / 0.70)`, at least one), capped at `max_workers`. At or
  below 70% it is the current count. It never asks for fewer workers than there are: the issue
  asks for scale-out only, and removing a GPU worker costs its running slice a checkpoint and a
  requeue; scaling in is left to the operator or the autoscaler's own scale-down policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

CLOSE_ABOVE = 0.85
REOPEN_BELOW = 0.75
PREFETCH_BELOW = 0.30
PREFETCH_OFF_ABOVE = 0.35
SCALE_OUT_ABOVE = 0.70
MAX_WORKERS = 64
# The load index is a ratio that can pass 1 when more is waiting than the GPUs can take; past
# this it is a broken forecast, not a busy cluster.
MAX_FORECAST = 100.0

# Real-time inference is worthless late (RT times out after 1 s): it is admitted whatever the
# forecast, and it is a small share of the load.
ALWAYS_ADMITTED = frozenset({"RT"})

ADMISSION = "admission_open"
PREFETCH = "prefetch_on"
WORKERS = "desired_workers"


@dataclass(frozen=True)
class Thresholds:
    close_above: float = CLOSE_ABOVE
    reopen_below: float = REOPEN_BELOW
    prefetch_below: float = PREFETCH_BELOW
    prefetch_off_above: float = PREFETCH_OFF_ABOVE
    scale_out_above: float = SCALE_OUT_ABOVE
    max_workers: int = MAX_WORKERS


@dataclass(frozen=True)
class Current:
    """The control state as it is before this forecast."""

    admission_open: bool = True
    prefetch_on: bool = False
    desired_workers: int | None = None


@dataclass(frozen=True)
class Decision:
    """One rule's answer. `changed` is False when the rule keeps the current value; the reason
    then says why it stays."""

    field: str
    old: bool | int | None
    new: bool | int
    reason: str

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass(frozen=True)
class Problem:
    field: str
    message: str


def pct(value: float, *against: float) -> str:
    """A share as a percentage, with as many decimals as it takes to differ from `against`
    (85.04% is not "85%" next to a threshold of 85%)."""
    for digits in range(4):
        text = f"{value * 100:.{digits}f}"
        if all(text != f"{other * 100:.{digits}f}" for other in against if other != value):
            return f"{text}%"
    return f"{value * 100:.4f}%"


def admits(tier_code: str, admission_open: bool) -> bool:
    """Whether a new job of this tier is queued now (else it is held until admission reopens)."""
    return admission_open or tier_code in ALWAYS_ADMITTED


def decide_admission(forecast: float, is_open: bool, t: Thresholds) -> Decision:
    f, close, reopen = forecast, t.close_above, t.reopen_below
    if is_open and f > close:
        return Decision(ADMISSION, True, False, f"admission closed: forecast {pct(f, close)} > {pct(close)}")
    if not is_open and f < reopen:
        return Decision(ADMISSION, False, True, f"admission reopened: forecast {pct(f, reopen)} < {pct(reopen)}")
    if is_open:
        return Decision(ADMISSION, True, True, f"admission open: forecast {pct(f, close)} <= {pct(close)}")
    return Decision(
        ADMISSION,
        False,
        False,
        f"admission stays closed: forecast {pct(f, reopen)} is not below {pct(reopen)} (closes above {pct(close)})",
    )


def decide_prefetch(forecast: float, is_on: bool, t: Thresholds) -> Decision:
    f, on_below, off_above = forecast, t.prefetch_below, t.prefetch_off_above
    if not is_on and f < on_below:
        return Decision(PREFETCH, False, True, f"prefetch on: forecast {pct(f, on_below)} < {pct(on_below)}")
    if is_on and f > off_above:
        return Decision(PREFETCH, True, False, f"prefetch off: forecast {pct(f, off_above)} > {pct(off_above)}")
    if is_on:
        return Decision(PREFETCH, True, True, f"prefetch stays on: forecast {pct(f, off_above)} <= {pct(off_above)}")
    return Decision(PREFETCH, False, False, f"prefetch off: forecast {pct(f, on_below)} >= {pct(on_below)}")


def decide_workers(forecast: float, workers: int, old: int | None, t: Thresholds) -> Decision:
    """`workers`: the GPU workers alive now; `old`: the desired count decided last time."""
    f, above = forecast, t.scale_out_above
    if f <= above:
        return Decision(WORKERS, old, workers, f"workers: {workers} as now, forecast {pct(f, above)} <= {pct(above)}")
    needed = max(1, math.ceil(workers * f / above))
    desired = max(workers, min(needed, t.max_workers))
    reason = (
        f"scale out to {desired} GPU worker(s) from {workers}: forecast {pct(f, above)} > {pct(above)} "
        f"(ceil({workers} x {pct(f)} / {pct(above)}) = {needed}"
    )
    if needed > t.max_workers:
        reason += f", capped at {t.max_workers}"
    return Decision(WORKERS, old, desired, reason + ")")


def closed_note(forced_by: str | None, forecast: float | None, t: Thresholds) -> str:
    """Why admission is closed, for a held job's history and pages. `forced_by`: the operator
    whose override is in force, if any."""
    if forced_by is not None:
        return f"admission closed by {forced_by or 'an operator'}"
    if forecast is None:
        return "admission closed"
    if forecast > t.close_above:
        return f"admission closed (forecast {pct(forecast, t.close_above)} > {pct(t.close_above)})"
    return (
        f"admission closed (forecast {pct(forecast, t.reopen_below)}, "
        f"not yet below {pct(t.reopen_below)} since it passed {pct(t.close_above)})"
    )


def decide(forecast: float, current: Current, workers: int, t: Thresholds) -> list[Decision]:
    """Every rule's decision for this forecast, changed or not, in a fixed order."""
    problem = forecast_problem(forecast)
    if problem:
        raise ValueError(problem)
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, not {workers}")
    return [
        decide_admission(forecast, current.admission_open, t),
        decide_prefetch(forecast, current.prefetch_on, t),
        decide_workers(forecast, workers, current.desired_workers, t),
    ]


def forecast_problem(forecast: float) -> str | None:
    if isinstance(forecast, bool) or not isinstance(forecast, (int, float)):
        return f"the forecast must be a number, not {type(forecast).__name__}"
    if not math.isfinite(forecast) or not 0 <= forecast <= MAX_FORECAST:
        return f"the forecast must be a load index between 0 and {MAX_FORECAST:g}, not {forecast!r}"
    return None


def threshold_problems(t: Thresholds) -> list[Problem]:
    """What is wrong with a set of thresholds; empty when they make sense together."""
    problems: list[Problem] = []
    shares = ("close_above", "reopen_below", "prefetch_below", "prefetch_off_above", "scale_out_above")
    for field in shares:
        value = getattr(t, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            problems.append(Problem(field, f"{field} must be a number, not {value!r}."))
        elif not 0 < value <= MAX_FORECAST:
            problems.append(Problem(field, f"{field} must be above 0 and at most {MAX_FORECAST:g}, not {value:g}."))
    if problems:
        return problems
    if not t.reopen_below < t.close_above:
        problems.append(
            Problem(
                "reopen_below",
                f"reopen_below ({t.reopen_below:g}) must be below close_above ({t.close_above:g}), "
                "or admission would flap.",
            )
        )
    if not t.prefetch_below < t.prefetch_off_above:
        problems.append(
            Problem(
                "prefetch_off_above",
                f"prefetch_off_above ({t.prefetch_off_above:g}) must be above prefetch_below "
                f"({t.prefetch_below:g}), or prefetch would flap.",
            )
        )
    if not t.prefetch_off_above < t.close_above:
        problems.append(
            Problem(
                "prefetch_off_above",
                f"prefetch_off_above ({t.prefetch_off_above:g}) must be below close_above ({t.close_above:g}): "
                "prefetching is for a quiet cluster.",
            )
        )
    if isinstance(t.max_workers, bool) or not isinstance(t.max_workers, int) or t.max_workers < 1:
        problems.append(
            Problem("max_workers", f"max_workers must be a whole number of at least 1, not {t.max_workers!r}.")
        )
    return problems
