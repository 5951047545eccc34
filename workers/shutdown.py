"""A flag the slice runner checks at each step, set when this worker is asked to stop.

gpuworkers sends SIGTERM to a worker's whole process group. The Celery parent begins its warm
shutdown; the pool child, running a job, gets the signal here, ends its slice at the next step
and yields (checkpoint and requeue), so the shutdown neither waits for the job's slice, which may
be longer than the stop's grace, nor loses work.
"""

from __future__ import annotations

import signal
import threading

requested = threading.Event()
_installed = False


def ensure_handler() -> None:
    """Install the SIGTERM handler in this process, once.

    Called at the start of each task rather than at pool start: billiard resets SIGTERM to its
    own exit handler after Celery's `worker_process_init` signal has run.
    """
    global _installed
    if not _installed:
        signal.signal(signal.SIGTERM, lambda signum, frame: requested.set())
        _installed = True
