"""What a replay is run with: the cluster, the cost of a switch, the live settings it mirrors."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clockq.policy import control, ordering, promotion
from clockq.policy.tiers import TIERS, TierSpec
from clockq.replay.admission import FORECAST_EVERY_S


@dataclass(frozen=True)
class SwitchCost:
    """What one switch costs (checkpoint, requeue, claim, restore), by the job's state size.

    The defaults are a line through `bench/switch_cost.py`'s medians on these machines (README,
    "Slice switch cost"): 10.7 ms with 1 MB of state, 130 ms with 100 MB."""

    fixed_ms: float = 9.5
    per_mb_ms: float = 1.2
    factor: float = 1.0  # 2.0 asks how the results move when switching costs twice as much

    def ms(self, checkpoint_mb: float) -> float:
        return (self.fixed_ms + self.per_mb_ms * checkpoint_mb) * self.factor


@dataclass(frozen=True)
class Config:
    gpus: int
    switch_cost: SwitchCost = field(default_factory=SwitchCost)
    tiers: Sequence[TierSpec] = TIERS
    seed: int = 0
    # The service ladder clockq's order runs on (CLOCKQ_SERVICE_LADDER_S live). A replay compressed
    # in time compresses it too, or no job reaches its first rung (bench/replay_live.py does).
    ladder: ordering.Ladder = ordering.DEFAULT_LADDER
    overhead_budget: float = 0.05  # CLOCKQ_OVERHEAD_BUDGET
    max_slice_ms: int = 5_000  # CLOCKQ_MAX_SLICE_MS
    # beat's schedule for the promotion tick and the batch chances (clockq/jobs/periodic.py)
    promotion_tick_s: float = promotion.PROMOTION_TICK_S
    batch_chance_every_s: float = promotion.BATCH_CHANCE_EVERY_S
    # LAS (Tiresias): queue thresholds in attained GPU-seconds, and its starvation knob.
    las_thresholds_gpu_s: tuple[float, ...] = (600.0, 3_600.0, 21_600.0)
    las_starve_knob: float = 8.0
    las_check_s: float = 10.0
    # Admission control (clockq/replay/admission.py): None replays without it.
    admission: control.Thresholds | None = None
    forecast_every_s: float = FORECAST_EVERY_S
    progress: Callable[[dict], None] | None = None
    progress_every_s: float = 2.0  # wall seconds between progress reports

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("gpus must be at least 1")
        for name in ("promotion_tick_s", "batch_chance_every_s", "las_check_s", "forecast_every_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if self.admission is not None and (problems := control.threshold_problems(self.admission)):
            raise ValueError("admission thresholds: " + " ".join(p.message for p in problems))
        if not isinstance(self.ladder, ordering.Ladder):
            raise ValueError(f"the service ladder must be an ordering.Ladder, not {type(self.ladder).__name__}")
        ranks = max(t.rank for t in self.tiers) + 1
        if self.ladder.tiers != ranks:
            raise ValueError(f"the service ladder is for {self.ladder.tiers} tiers, the replay has {ranks}")
        if self.las_starve_knob < 0:
            raise ValueError("the LAS starvation knob cannot be negative")
        if list(self.las_thresholds_gpu_s) != sorted(self.las_thresholds_gpu_s) or any(
            t <= 0 for t in self.las_thresholds_gpu_s
        ):
            raise ValueError("LAS thresholds must be positive and increasing")


def ladder_from_text(text: str) -> ordering.Ladder:
    """A service ladder from its rungs for the least urgent tier, in GPU-seconds: "300,2400,19200"
    (CLOCKQ_SERVICE_LADDER_S's form). A bad one raises ValueError saying why."""
    try:
        rungs = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of GPU-seconds") from None
    return ordering.Ladder(base_gpu_s=rungs)


def ladder_text(ladder: ordering.Ladder) -> str:
    """The ladder's rungs as ladder_from_text and CLOCKQ_SERVICE_LADDER_S read them."""
    return ",".join(f"{rung:.12g}" for rung in ladder.base_gpu_s)


__all__ = ["Config", "SwitchCost", "ladder_from_text", "ladder_text"]
