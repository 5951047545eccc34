"""How a run's parts say that the job is no longer this worker's, or that its code failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from clockq.jobs.checkpoints import StorageError
from clockq.jobs.results import ResultError
from workers.workloads.base import JobRefused, StartAbandoned


class LostOwnership(Exception):
    """The job was cancelled, or taken back by the reaper, while this worker ran it."""


class SliceFailed(Exception):
    """The workload (or its checkpoint) raised; the job rolls back to its last checkpoint."""


@contextmanager
def workload_errors() -> Iterator[None]:
    """Turn any error from workload code into SliceFailed, so that infrastructure errors
    (database, broker) are never counted against the job."""
    try:
        yield
    except (JobRefused, ResultError, StartAbandoned, StorageError):
        # refused, not mended by a retry, (StartAbandoned) no failure, or (StorageError) the
        # host's disk: the caller decides
        raise
    except Exception as exc:
        raise SliceFailed(repr(exc)) from exc
