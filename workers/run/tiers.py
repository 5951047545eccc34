"""Which tier a running job belongs to: the one it runs in now, and its own.

A promoted job is scheduled in the higher tier until it has had a fair amount of service there
(`Ladder.promotion_over`: the first rung of that tier's ladder, the rule the replay asks too),
then returns to its own (home) tier; the next write of the job says so, and its history with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from clockq.policy.ordering import Ladder
from workers.run.claim import ClaimedJob
from workers.runtime import TierCache, TierInfo


@dataclass
class RunTiers:
    current: TierInfo  # plans its slices, ranks it at a boundary, names the queue it goes back to
    home: TierInfo  # its own: its slices count in it
    returning_from: TierInfo | None = None  # set until the return is written
    served_ms: float = 0.0  # its service in `current` since its promotion (while promoted)
    level_from_ms: float = 0.0  # its service when its level began to count (a batch chance), else 0

    @classmethod
    def of(cls, job: ClaimedJob, tiers: TierCache) -> RunTiers:
        served = job.run_ms - (job.promoted_run_ms if job.promoted_run_ms is not None else job.run_ms)
        return cls(
            current=tiers.get(job.tier_id),
            home=tiers.get(job.original_tier_id),
            served_ms=max(served, 0),
            level_from_ms=job.level_from_ms,
        )

    @property
    def promoted(self) -> bool:
        return self.current.id != self.home.id

    def serve(self, used_ms: float, ladder: Ladder) -> None:
        """Count a slice's service; a promoted job that has had its fair amount goes home."""
        if not self.promoted:
            return
        self.served_ms += used_ms
        if ladder.promotion_over(self.current.rank, self.served_ms / 1000):
            self.return_home()

    def return_home(self) -> None:
        """A promoted job belongs to its own tier again, its level counting all its service."""
        if self.promoted:
            self.returning_from, self.current = self.current, self.home
            self.level_from_ms = 0.0
