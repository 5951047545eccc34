"""The standby RT lane of a GPU (workers/rt_lane.py): how an RT job it took gets the GPU.

A lane is a second worker process on a GPU that takes only RT jobs. The GPU's running job can
pause in place, its state left where it is (no snapshot, no write, no requeue), when the RT
job's declared memory fits beside it; otherwise it leaves through the checkpoint path, as for
any RT job without a lane. A pause is bounded: past `pause_max_s` the paused job leaves through
the checkpoint path too, so that an RT job that runs long (or a lane that hangs) does not hold
a paused job's GPU memory for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from clockq.policy.ordering import interrupts, is_realtime


class LanePath(StrEnum):
    FREE = "free"  # the GPU's main worker runs nothing: the RT job just runs
    PAUSE_IN_PLACE = "pause"  # the running job pauses at its next step, its state where it is
    CHECKPOINT = "checkpoint"  # the running job leaves through a checkpoint first
    ELSEWHERE = "elsewhere"  # another GPU runs nothing: the RT job is left to it, nothing pauses


@dataclass(frozen=True)
class LaneView:
    """What a lane knows of its GPU when it takes an RT job."""

    rt_mem_mib: int | None  # the RT job's declared GPU memory (None: not declared)
    running_mem_mib: int | None  # the running job's declared GPU memory (None: not declared)
    running: bool  # whether the GPU's main worker runs a job
    free_mib: int | None  # the GPU's free memory as measured (NVML); None on a simulated GPU
    total_mib: int | None  # the GPU's memory (a simulated GPU's CLOCKQ_SIM_GPU_MEMORY_MIB)
    # GPUs whose own worker is live, takes jobs and runs none; 0 once this lane has left this RT
    # job to them already (a heartbeat outlives a dead worker: leave it once, not for ever)
    free_elsewhere: int = 0


def rt_lane_path(view: LaneView) -> LanePath:
    """Leave the RT job to a GPU that runs nothing, where there is one. Otherwise pause the
    running job in place only when the RT job's memory surely fits beside it: the
    measured free memory where there is a measure, else the GPU's memory less what the running
    job declared. An RT job that declares nothing needs nothing more than what is free; a
    running job that declares nothing on an unmeasured GPU leaves no room known to be free."""
    if not view.running:
        return LanePath.FREE
    if view.free_elsewhere > 0:
        return LanePath.ELSEWHERE  # a free GPU starts it as soon, and no job pays a pause
    need = view.rt_mem_mib or 0
    free = view.free_mib
    if free is None and view.total_mib is not None:
        free = None if view.running_mem_mib is None else view.total_mib - view.running_mem_mib
    if free is None:
        return LanePath.PAUSE_IN_PLACE if need == 0 else LanePath.CHECKPOINT
    return LanePath.PAUSE_IN_PLACE if need <= free else LanePath.CHECKPOINT


def pause_over(paused_s: float, pause_max_s: float) -> bool:
    """Whether a pause has lasted long enough that the paused job leaves through a checkpoint."""
    return paused_s >= pause_max_s


def lanes_take_urgent(waiting: list[int], idle_lanes: int) -> bool:
    """At a running job's look for an urgent job: whether idle RT lanes take every urgent job
    waiting, so that no running job makes way through a checkpoint. Only RT jobs go to lanes:
    an HP job waiting is the order's to place, as without lanes."""
    urgent_beyond_rt = any(n for rank, n in enumerate(waiting) if not is_realtime(rank) and interrupts(rank))
    rt_waiting = sum(n for rank, n in enumerate(waiting) if is_realtime(rank))
    return rt_waiting > 0 and not urgent_beyond_rt and idle_lanes >= rt_waiting


def service_ms(elapsed_ms: float, paused_ms: float) -> float:
    """A slice's service to its job: its time on the GPU less its pause. The pause is neither
    the job's service (the order does not charge it) nor a switch (its job never left the GPU,
    so the overhead budget does not count it)."""
    return max(elapsed_ms - paused_ms, 0.0)
