"""The contract every workload implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


class JobRefused(Exception):
    """The job can never run on this worker as things are (its configuration, its owner's
    quota). Retrying would only fail again, so the job fails at once with this reason."""


class StartAbandoned(Exception):
    """`ready()` gave up starting because `abandon()` said so (an urgent job takes the GPU): what it
    had started is undone, and the job goes back to its queue as it was."""


@dataclass(frozen=True)
class RunContext:
    """Where a workload runs: its job, its GPU and a scratch folder that survives requeues."""

    job_id: int
    gpu_index: int
    work_dir: Path
    cache_dir: Path | None = None  # data shared by the host's jobs, which prefetch() may fill
    storage: Any = None  # workers.storage_watch.JobStorage of a claimed job; None outside a claim


class Workload(ABC):
    """A job's code. The slice runner calls `step()` until the slice is used up.

    `state_dict()` returns the bytes needed to resume; the workload owns their format.
    `load_state_dict()` is called after `setup()` when resuming from a checkpoint.
    """

    name: ClassVar[str]  # its params schema is clockq.jobs.workloads.SPECS[name]

    def __init__(self, params: dict[str, Any]):
        self.params = params

    @classmethod
    def prefetch(cls, params: dict[str, Any], cache_dir: Path) -> bool:
        """Fetch or build the job's data into `cache_dir` before the job runs, so that its
        first slice finds it there. Called on the GPU hosts while the load forecast is low
        (prefetch on), for queued jobs. Returns whether it did any work. Optional: most
        workloads have nothing to fetch."""
        return False

    def setup(self, ctx: RunContext) -> None:  # noqa: B027 - optional hook
        """Prepare to run (build models, open files). Called once per claim."""

    def ready(self, abandon: Callable[[], bool] | None = None) -> None:  # noqa: B027 - optional hook
        """Called at every claim, after `setup()` and any `load_state_dict()`, and also when the
        job comes back to a worker that kept it warm: do what must happen before work can start
        (start a process). Its time is charged to the switch, not to the slice, so a slice is
        not eaten by it. Where that takes a while, ask `abandon()` now and then; when it says
        so, undo what was started and raise StartAbandoned. Optional."""

    @abstractmethod
    def step(self) -> float:
        """Do one unit of work and return progress in [0, 1]; 1 means done."""

    @abstractmethod
    def state_dict(self) -> bytes: ...

    @abstractmethod
    def load_state_dict(self, state: bytes) -> None: ...

    def snapshot(self) -> bytes | Sequence[bytes | bytearray | memoryview]:
        """The state to checkpoint, as `state_dict()` would give it, but as chunks that may
        still be live: a bytearray or an array's buffer is copied into host memory by the worker
        before the next step (workers/persister.py), while immutable `bytes` are kept as they
        are. A workload whose state sits in big buffers avoids a serialising copy this way.
        `load_state_dict` gets the chunks joined. Optional: by default, `state_dict()`."""
        return self.state_dict()

    def metrics(self) -> Iterable[tuple[int, str, float]]:
        """Called after every step: the (step, name, value) records the workload measured since
        the last call, such as (120, "loss", 0.31). The worker keeps them bounded and writes them
        at checkpointed slice boundaries. Optional."""
        return ()

    def write_result(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Called once, after the step that returned 1: write what the job produced (its
        result: a file or a few) into `directory`, an empty folder. Plain file names only; the
        store checks, hashes and keeps them (clockq/jobs/results.py). Writing nothing is fine."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; called when the worker stops running this job."""

    def declared_gpu_util(self) -> float | None:
        """GPU utilisation the workload declares, for simulated GPUs. None if unknown."""
        return None
