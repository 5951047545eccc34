"""What became of one dispatch message."""

from __future__ import annotations

from enum import StrEnum


class RunOutcome(StrEnum):
    """What became of one dispatch message, as the task returns it (Celery logs it)."""

    MALFORMED = "malformed"  # not a (job id, token) pair; dropped
    STALE = "stale"  # the job is not queued with this token, or cannot run here now
    DRAINED = "drained"  # this worker is drained: the message went back to its queue
    SUCCEEDED = "succeeded"
    YIELDED = "yielded"  # checkpointed and back in its queue
    HELD = "held"
    TIMED_OUT = "timed_out"
    RETRYING = "retrying"  # the workload raised; back in its queue from the last checkpoint
    STORAGE_FAULT = "storage-fault"  # checkpoint storage failed; back in its queue, not charged
    FAILED = "failed"  # the workload raised once too often
    LOST_OWNERSHIP = "lost-ownership"  # cancelled or taken back by the reaper while running
