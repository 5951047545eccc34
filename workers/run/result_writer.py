"""Store a finished job's result, durably, before the job counts as succeeded.

The workload writes its result into a staging folder, which the result store checks and puts in
place. A crash after this and before the job's final write only means the job resumes from its
last checkpoint and finishes (and stores its result) again.
"""

from __future__ import annotations

import errno
import logging
import shutil
from datetime import datetime
from typing import Any

from clockq.jobs.checkpoints import StorageError
from clockq.jobs.results import Manifest, ResultStorageError
from workers import shutdown
from workers.run.errors import SliceFailed, workload_errors
from workers.runtime import STORAGE_PROBE_EVERY_S, WorkerStores
from workers.workloads.base import Workload

log = logging.getLogger("clockq.slices")

# Errors of the storage itself (full, over quota, read-only, failing), whoever's write met them.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


class ResultWriter:
    """Where a finished job's result goes: the result store, on the checkpoint storage."""

    def __init__(self, job_id: int, stores: WorkerStores):
        self.job_id = job_id
        self.stores = stores

    def store(self, workload: Workload) -> Manifest:
        """The result, in place. StorageError when the storage failed, whoever's code hit it."""
        try:
            staged = self.stores.results.staging(self.job_id)
        except ResultStorageError as exc:
            raise StorageError(str(exc)) from exc
        try:
            try:
                with workload_errors():
                    workload.write_result(staged)
            except SliceFailed as exc:
                # The staging folder is on the checkpoint storage: a full or failing disk there is
                # the storage's fault, not the job's, whoever's code hit it.
                if isinstance(exc.__cause__, OSError) and exc.__cause__.errno in _STORAGE_ERRNOS:
                    raise StorageError(f"writing the result of job {self.job_id}: {exc.__cause__}") from exc
                raise
            manifest = self.stores.results.store(self.job_id, staged)
        except ResultStorageError as exc:
            raise StorageError(str(exc)) from exc
        finally:
            # A failed attempt leaves nothing on the store (a full one least of all); after a
            # store, the folder was renamed into place and this finds nothing.
            shutil.rmtree(staged, ignore_errors=True)
        self.stores.storage_works()
        return manifest

    def wait_for_room(self, exc: StorageError) -> None:
        """The job is done but its result cannot be stored: say so, and wait a moment before the
        next try. The job keeps its GPU and its work meanwhile, rather than go back to its queue
        and do the work since its last checkpoint again."""
        log.warning("job %s: done, waiting for room to store its result: %s", self.job_id, exc)
        self.stores.storage_failed(str(exc))
        shutdown.requested.wait(STORAGE_PROBE_EVERY_S)


def succeeded_fields(result: Manifest, now: datetime) -> dict[str, Any]:
    """The job's columns as it succeeds with `result`."""
    return {
        "finished_at": now,
        "progress": 1.0,
        "result_files": result.as_json(),
        "result_bytes": result.total_bytes,
        "result_stored_at": now if result.files else None,
    }
