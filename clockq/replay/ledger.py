"""Where a replay's GPU time went: computing, switching, and held or idle while jobs waited.

The engine tells the ledger each span of time that passes, with how many GPUs running jobs held
and whether any job waited; the work and switches of jobs as they are accounted for. Besides the
totals it keeps what was held within the trace's arrival window (first to last submit): the
utilisation of a cluster under its offered load, which the drain after the last arrival does not
blur (docs/replay.md, "Utilisation").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Ledger:
    gpus: int
    window_start: float  # the first submit
    window_end: float  # the last submit
    busy_gpu_s: float = 0.0  # computing, whether or not the job later finished
    switch_gpu_s: float = 0.0  # checkpointing and switching
    waiting_s: float = 0.0  # time during which at least one job waited
    held_while_waiting_gpu_s: float = 0.0  # GPU-seconds held by running jobs during that time
    window_held_gpu_s: float = 0.0  # GPU-seconds held by running jobs within the arrival window

    def elapse(self, start: float, end: float, *, held_gpus: int, jobs_wait: bool) -> None:
        """Time from `start` to `end` passed with `held_gpus` held by running jobs."""
        if end <= start:
            return
        if jobs_wait:
            self.waiting_s += end - start
            self.held_while_waiting_gpu_s += (end - start) * held_gpus
        overlap = min(end, self.window_end) - max(start, self.window_start)
        if overlap > 0:
            self.window_held_gpu_s += overlap * held_gpus

    @property
    def window_s(self) -> float:
        return self.window_end - self.window_start
