"""The control rules: what a load forecast does to admission, prefetch and the worker count.

The forecast is the load index expected 15 minutes ahead (0 idle, 1 every GPU spoken for; it may
exceed 1 when more is waiting than the GPUs can take). These functions take it with the current
state and return decisions, each with a reason that names the forecast and the threshold; a
service in the core (clockq/control_state/control.py) writes them.

- **Admission** closes above `close_above` (85%) and reopens only below `reopen_below` (75% by
  default). Between the two the state stays as it is, so a forecast wandering around 85%
  changes admission once, not at every forecast.
- **What a closed admission holds** (`admits`). RT never. By default (`hold="when-full"`) a new
  job only while the cluster is full for it (`Room.full`): no GPU is free, and queued work that
  the order puts in a better class (`ordering.outranks`: a lower service level, else a more
  urgent tier) already asks for every GPU. Such a job would wait anyway, so holding it costs
  it nothing but the wait for the next forecast, which asks again and queues it once it would
  start; it keeps its place in the order (its first submit time, no service). Holding any
  other job delays the job the order would start first: a new job has had no service, and the
  order by attained service starts new work ahead of long work. In the trace replay that cost
  mean completion time and on-time rate on every trace, up to x12 (docs/benchmarks.md).
  `hold="all"` is the literal reading of the specification, every new job but RT while
  admission is closed, released when it reopens; an operator's forced closure always holds
  that way.
- **Persistence waits for a warm-up.** Until a model beats it, the forecast is persistence: the
  load index now stands for the one 15 minutes ahead. On a fresh installation that is a guess
  about a burst (a demo's first backlog reads 200% and drains in minutes), so admission acts on
  persistence only once `warmup_samples` load samples are kept (an hour at one a minute, live);
  before that it stays open, and a model's forecast acts at once. The replay, which models a
  cluster in its steady state, runs with no warm-up (`Thresholds.warmup_samples` is 0).
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
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from clockq.policy import ordering

# Real-time inference is worthless late (RT times out after 1 s): it is admitted whatever the
# forecast, and it is a small share of the load (`TierSpec.always_admitted`).
from clockq.policy.tiers import ALWAYS_ADMITTED

CLOSE_ABOVE = 0.85
REOPEN_BELOW = 0.75
PREFETCH_BELOW = 0.30
PREFETCH_OFF_ABOVE = 0.35
SCALE_OUT_ABOVE = 0.70
MAX_WORKERS = 64
# Load samples kept before a persistence forecast moves admission (the live default of
# CLOCKQ_ADMISSION_WARMUP_SAMPLES: an hour of samples at one a minute, four horizons).
WARMUP_SAMPLES = 60
PERSISTENCE = "persistence"
# The load index is a ratio that can pass 1 when more is waiting than the GPUs can take; past
# this it is a broken forecast, not a busy cluster.
MAX_FORECAST = 100.0

# What a closed admission holds (module docstring): only jobs that would wait anyway, or every
# new job but RT.
HOLD_WHEN_FULL = "when-full"
HOLD_ALL = "all"
HOLD_MODES = (HOLD_WHEN_FULL, HOLD_ALL)

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
    hold: str = HOLD_WHEN_FULL  # what a closed admission holds: HOLD_MODES
    # Load samples kept before a persistence forecast moves admission; 0 acts at once (the
    # replay's steady state). Live: CLOCKQ_ADMISSION_WARMUP_SAMPLES, WARMUP_SAMPLES by default.
    warmup_samples: int = 0


@dataclass(frozen=True)
class Basis:
    """What a forecast stands on: the model that made it ("persistence", "linear", "lstm") and
    the load samples kept when it was made."""

    model: str = PERSISTENCE
    samples: int = 0

    def warming_up(self, t: Thresholds) -> bool:
        """Whether admission leaves this forecast alone: persistence, before the warm-up is over."""
        return self.model == PERSISTENCE and self.samples < t.warmup_samples


@dataclass(frozen=True)
class Room:
    """What a new job of one tier would find if it were queued now."""

    gpus: int  # the cluster's GPUs; 0 when not known, and then nothing is held on a guess
    free_gpus: int  # GPUs that no job holds
    gpus_ahead: int  # GPUs asked for by queued work in a better class than it (`gpus_ahead`)

    @property
    def full(self) -> bool:
        """Whether it would wait anyway: no GPU is free, and work that starts before it already
        asks for every GPU."""
        return self.gpus > 0 and self.free_gpus <= 0 and self.gpus_ahead >= self.gpus


def gpus_ahead(rank: int, queued: Iterable[ordering.Standing]) -> int:
    """The GPUs that queued work in a better class than a new job of tier `rank` asks for: work
    the order starts before it whatever else happens. A new job has had no service (level 0)
    and is its own tier's; jobs of its own class are left out, though some (a lighter user's,
    an older one) come first: the count errs towards holding less. A standing may stand for a
    class of jobs, with their GPUs summed in `gpus`."""
    new = ordering.Standing(rank=rank, level=0, user_share_gpu_s=0.0, submitted=0.0)
    return sum(s.gpus for s in queued if ordering.outranks(s, new))


@dataclass(frozen=True)
class Cluster:
    """The cluster as a closed admission weighs it: its GPUs, the free ones, and the queued
    work (a standing per job, or per class with its GPUs summed)."""

    gpus: int = 0
    free_gpus: int = 0
    queued: tuple[ordering.Standing, ...] = ()

    def room(self, rank: int) -> Room:
        return Room(self.gpus, self.free_gpus, gpus_ahead(rank, self.queued))

    def with_queued(self, rank: int, gpus: int = 1) -> Cluster:
        """After `gpus` new jobs of tier `rank` were queued (a batch's earlier entries, a release)."""
        new = ordering.Standing(rank=rank, level=0, user_share_gpu_s=0.0, submitted=0.0, gpus=gpus)
        return replace(self, queued=(*self.queued, new))


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


def admits(
    tier_code: str, admission_open: bool, *, forced: bool = False, hold: str = HOLD_WHEN_FULL, room: Room | None = None
) -> bool:
    """Whether a job of this tier that is new, or held for admission, is queued now; else it
    is held, and asked again at the next forecast. `forced`: an operator closed admission;
    `room`: what the job would find (None: not known, and nothing is held on a guess)."""
    if admission_open or tier_code in ALWAYS_ADMITTED:
        return True
    if forced or hold == HOLD_ALL:
        return False
    return room is None or not room.full


def weighs_room(tier_code: str, admission_open: bool, *, forced: bool = False, hold: str = HOLD_WHEN_FULL) -> bool:
    """Whether `admits` needs the room for this job: the room is read only then."""
    return not (admission_open or tier_code in ALWAYS_ADMITTED or forced or hold == HOLD_ALL)


def held_note(room: Room) -> str:
    """Why a closed admission holds a job, beside `closed_note`."""
    return (
        f"the cluster is full for it: no GPU is free, and new work of more urgent tiers already waits for "
        f"{room.gpus_ahead} GPU(s) (the cluster has {room.gpus})"
    )


def holding_note(*, forced: bool, hold: str) -> str:
    """What a closed admission does to new jobs, for the submit form."""
    always = ", ".join(sorted(ALWAYS_ADMITTED))
    if forced or hold == HOLD_ALL:
        return (
            "New jobs are accepted and held, not dropped; they are queued when admission reopens, the most "
            f"urgent tier first, then the oldest. {always} jobs are always admitted."
        )
    return (
        "A new job is queued as usual unless the cluster is full for it (no GPU free, and new work of more "
        "urgent tiers already waiting for every GPU): then it is held, not dropped, and queued at the first "
        f"forecast at which it would start. {always} jobs are always admitted."
    )


def release_note(*, forced: bool, hold: str) -> str:
    """When a job held for admission is queued."""
    if forced or hold == HOLD_ALL:
        return "it is queued when admission reopens"
    return "it is queued at the first forecast at which it would start, or when admission reopens"


@dataclass(frozen=True)
class ExpectedRelease:
    """When a job held for admission is expected to be queued: `at`, the next forecast, which
    asks again (None: only an operator can release it), and `condition`, what that forecast
    must find. `forecast` and `reopen_below` are the numbers the condition names."""

    at: datetime | None
    condition: str
    forecast: float | None = None
    reopen_below: float | None = None


def expected_release(
    *,
    admission_open: bool,
    forced_by: str | None,
    forecast: float | None,
    forecast_at: datetime | None,
    every_s: float,
    now: datetime,
    t: Thresholds,
) -> ExpectedRelease:
    """When a job held for admission is expected to be released, from the control state: an
    operator's closure holds it until the operator reopens; otherwise the next forecast (due
    `every_s` after the latest, never before `now`) asks again, as `release_held_that_would_start`
    and `decide_admission` do. The forecast is one value 15 minutes ahead, not a path, so no later
    step is predicted: the condition says what the next one must find."""
    if forced_by is not None:
        return ExpectedRelease(None, f"when {forced_by or 'an operator'} reopens admission")
    due = now if forecast_at is None else max(now, forecast_at + timedelta(seconds=every_s))
    reopen = t.reopen_below
    if admission_open:
        return ExpectedRelease(due, "at the next forecast: admission is open again", forecast, reopen)
    now_at = f" (the latest forecast is {pct(forecast, reopen)})" if forecast is not None else ""
    reopens = f"when admission reopens: the forecast falls below {pct(reopen)}{now_at}"
    if t.hold == HOLD_ALL:
        return ExpectedRelease(due, reopens, forecast, reopen)
    return ExpectedRelease(
        due,
        "at the first forecast at which it would start (a GPU free, or no longer every GPU asked for by more "
        f"urgent work), at the latest {reopens}",
        forecast,
        reopen,
    )


def decide_admission(forecast: float, is_open: bool, t: Thresholds, basis: Basis | None = None) -> Decision:
    """`basis`: what the forecast stands on; None, a forecast acted on as it is."""
    f, close, reopen = forecast, t.close_above, t.reopen_below
    if basis is not None and basis.warming_up(t):
        why = (
            f"forecast {pct(f)} is persistence, acted on only once {t.warmup_samples} load samples are kept "
            f"({basis.samples} so far)"
        )
        return Decision(ADMISSION, is_open, True, f"admission {'open' if is_open else 'reopened'}: {why}")
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


def decide(
    forecast: float, current: Current, workers: int, t: Thresholds, basis: Basis | None = None
) -> list[Decision]:
    """Every rule's decision for this forecast, changed or not, in a fixed order. `basis`: what
    the forecast stands on (admission waits out persistence's warm-up); None, acted on as it is."""
    problem = forecast_problem(forecast)
    if problem:
        raise ValueError(problem)
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, not {workers}")
    return [
        decide_admission(forecast, current.admission_open, t, basis),
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
    if isinstance(t.warmup_samples, bool) or not isinstance(t.warmup_samples, int) or t.warmup_samples < 0:
        problems.append(
            Problem("warmup_samples", f"warmup_samples must be a whole number of 0 or more, not {t.warmup_samples!r}.")
        )
    if t.hold not in HOLD_MODES:
        problems.append(Problem("hold", f"hold must be one of {', '.join(HOLD_MODES)}, not {t.hold!r}."))
    if isinstance(t.max_workers, bool) or not isinstance(t.max_workers, int) or t.max_workers < 1:
        problems.append(
            Problem("max_workers", f"max_workers must be a whole number of at least 1, not {t.max_workers!r}.")
        )
    return problems
