"""Where one claim stands in its looks for urgent jobs: a small state machine, pure (the clock
is passed in), that workers/run/boundary.py moves at each look.

An urgent job (a tier that interrupts) is announced to every busy GPU, and each whose job it
could displace looks at its next step: it asks the order whether it is the one to make way. A
look ends in one of four states:

    CALM               nothing waits that this GPU must look again for: the next look comes
                       with the next announcement
    AWAITING_FREE_GPU  the look went on while a GPU counted as free (clockq/bus/free_gpus.py):
                       look once more when that GPU no longer counts (FREE_S later), so that a
                       worker that died just after it left a job holds an urgent job back by at
                       most FREE_S
    AWAITING_VICTIM    the look named another GPU's job to make way: look once more if it has
                       not in UNRESPONSIVE_S (its worker died, or hangs in a long step); it is
                       then passed over, and the next victim is named (at most MAX_PASSED_OVER)
    MAKING_WAY         the look named this job: the slice ends at this step, and the boundary
                       decides from that look (`made_way` once it has)

A GPU looks once more at most twice per announcement: a look that is itself the second
(`relook`) never arms another wait for a free GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from clockq.bus.free_gpus import FREE_S

# A job named to make way for an urgent job leaves at its next step, a few to a few hundred ms
# away. One that has not after this long is passed over: an RT job's start timeout is 1 s, and a
# dead worker's job stays running until the reaper takes it back.
UNRESPONSIVE_S = 0.25
MAX_PASSED_OVER = 2


class Looking(StrEnum):
    CALM = "calm"
    AWAITING_FREE_GPU = "awaiting a free GPU"
    AWAITING_VICTIM = "awaiting the victim"
    MAKING_WAY = "making way"


@dataclass(frozen=True)
class UrgentLooks:
    """The state of a claim's looks, and its moves. Each move returns the next state."""

    state: Looking = Looking.CALM
    relook_at: float | None = None  # AWAITING_*: when (monotonic) to look once more
    awaited: tuple[int, float] | None = None  # AWAITING_VICTIM: the job named, and when it first was
    passed_over: frozenset[int] = field(default_factory=frozenset)  # named, and did not make way in time

    def relook_due(self, now: float) -> bool:
        """Whether to look once more now, with no announcement (AWAITING_*)."""
        return self.relook_at is not None and now >= self.relook_at

    def relooking(self) -> UrgentLooks:
        """The look once more is under way: its wait is over, whatever the look finds. The job
        awaited is remembered, so that, named again, it counts from when it was first named."""
        return replace(self, state=Looking.CALM, relook_at=None)

    def nothing_waits(self) -> UrgentLooks:
        """No urgent job waits any more (a GPU took it, or it was answered): all calm, and the
        jobs passed over count again."""
        return UrgentLooks()

    def overdue(self, victim_id: int | None, now: float) -> bool:
        """Whether `victim_id`, named again, was named UNRESPONSIVE_S ago and has not made way."""
        return (
            victim_id is not None
            and self.awaited is not None
            and self.awaited[0] == victim_id
            and now >= self.awaited[1] + UNRESPONSIVE_S
            and len(self.passed_over) < MAX_PASSED_OVER
        )

    def pass_over(self, victim_id: int) -> UrgentLooks:
        """`victim_id` did not make way in time: the order names another, without it."""
        return replace(self, passed_over=self.passed_over | {victim_id})

    def other_named(self, victim_id: int | None, *, me: int, now: float, gpu_freed: bool, relook: bool) -> UrgentLooks:
        """The look did not name this job. Await the job it named on another GPU (if any, and
        not too many were passed over already); else, if a GPU counted as free, await that one
        (unless this look was itself the second, or a wait is armed already); else calm."""
        if victim_id is not None and victim_id != me and len(self.passed_over) < MAX_PASSED_OVER:
            since = self.awaited[1] if self.awaited is not None and self.awaited[0] == victim_id else now
            return replace(
                self, state=Looking.AWAITING_VICTIM, awaited=(victim_id, since), relook_at=since + UNRESPONSIVE_S
            )
        if self.state == Looking.AWAITING_FREE_GPU:
            return replace(self, awaited=None)  # the wait armed earlier stands, and is not pushed back
        if gpu_freed and not relook:
            return replace(self, state=Looking.AWAITING_FREE_GPU, awaited=None, relook_at=now + FREE_S)
        return replace(self, state=Looking.CALM, awaited=None, relook_at=None)

    def this_named(self) -> UrgentLooks:
        """The look named this job to make way: the slice ends here."""
        return replace(self, state=Looking.MAKING_WAY, awaited=None, relook_at=None)

    def made_way(self) -> UrgentLooks:
        """The boundary decided from the look that named this job (or the restore gave the GPU
        up for it): nothing more to wait for."""
        return replace(self, state=Looking.CALM) if self.state == Looking.MAKING_WAY else self
