"""Which tier a running job belongs to: the one it runs in now, and its own.

A promoted job runs one slice in the higher tier, then returns to its own (home) tier; the next
write of the job says so, and its history with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.run.claim import ClaimedJob
from workers.runtime import TierCache, TierInfo


@dataclass
class RunTiers:
    current: TierInfo  # plans its slices, ranks it at a boundary, names the queue it goes back to
    home: TierInfo  # its own: whom it makes way for is reckoned from it, and its slices count in it
    returning_from: TierInfo | None = None  # set until the return is written

    @classmethod
    def of(cls, job: ClaimedJob, tiers: TierCache) -> RunTiers:
        return cls(current=tiers.get(job.tier_id), home=tiers.get(job.original_tier_id))

    def return_home(self) -> None:
        """After its one slice in a higher tier, a promoted job belongs to its own tier again."""
        if self.current.id != self.home.id:
            self.returning_from, self.current = self.current, self.home
