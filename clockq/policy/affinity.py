"""Placement affinity: a preempted job goes back to the GPU that holds its state warm.

A worker keeps the workloads it yielded live (workers/warm_cache.py), so a job that comes back
to it skips its checkpoint's read and load. A free GPU that is not a job's warm one leaves the
job to it, but only for a bounded time after the job was queued, and only while the warm GPU is
busy (a free one would take it itself): a job never waits longer than the bound for a busy warm
GPU while another GPU is free. Which job a free GPU takes is still `ordering.pick_next`'s; this
only says how long the GPU that is not the job's warm one waits before it takes it.
"""

from __future__ import annotations

# A default bound: a few hundred milliseconds, about a slice of the urgent tiers, and well within
# the 1 s an RT job's start allows. A cold restore of a small state costs less than that; of a
# large one (hundreds of MB, a model build) far more.
WARM_WAIT_S = 0.2


def wait_for_warm_s(
    *, this_worker: str, warm_worker: str, warm_worker_busy: bool, queued_for_s: float, bound_s: float = WARM_WAIT_S
) -> float:
    """How much longer a free GPU (`this_worker`) leaves a queued job to the worker that holds it
    warm (`warm_worker`, "" if none): 0 to take it now. It waits only while the warm worker is
    busy, and only until the job has been queued `bound_s`."""
    if not warm_worker or warm_worker == this_worker or not warm_worker_busy or bound_s <= 0:
        return 0.0
    return max(bound_s - max(queued_for_s, 0.0), 0.0)
