"""What a trace holds once read, and what a replay gives back for each job."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace, in the trace's own seconds (after any time scaling)."""

    key: str  # the trace's own id or name for it
    line: int  # line in the trace file, for messages
    submit_s: float
    duration_s: float  # run time alone on its GPUs, without any switching
    num_gpu: int  # GPUs held together for its whole run (a gang)
    tier: str  # tier code, after the trace's mapping
    deadline_s: float | None  # absolute, in trace seconds; None: no deadline
    checkpoint_mb: float  # size of its state: what a switch costs follows from it
    avg_util: float | None = None  # GPU utilisation, if the trace tells it (slice planning)
    user: str = ""  # who submitted it, if the trace tells it (fair share between users)


@dataclass
class Trace:
    name: str
    jobs: list[TraceJob]  # in submission order
    # Rows that describe no GPU job (no GPU requested, never ran in the trace ...), by reason.
    skipped: dict[str, int] = field(default_factory=dict)
    mapping: list[str] = field(default_factory=list)  # how rows became tiers and deadlines, in words


class TraceError(ValueError):
    """A trace that cannot be replayed honestly. Names the file, line and column."""

    def __init__(self, path: str, line: int | None, column: str | None, message: str):
        self.path, self.line, self.column = path, line, column
        where = path + (f", line {line}" if line is not None else "") + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {message}")


@dataclass
class JobResult:
    """How one job fared under one policy. Times in trace seconds; None: it never happened."""

    job: TraceJob
    first_start_s: float | None = None
    finish_s: float | None = None
    timed_out: bool = False
    preemptions: int = 0  # times it left its GPUs before it was done
    promotions: int = 0

    @property
    def succeeded(self) -> bool:
        return self.finish_s is not None and not self.timed_out

    @property
    def wait_s(self) -> float | None:
        return None if self.first_start_s is None else self.first_start_s - self.job.submit_s

    @property
    def jct_s(self) -> float | None:
        return None if not self.succeeded else self.finish_s - self.job.submit_s  # type: ignore[operator]


@dataclass
class RunResult:
    """One policy's replay of one trace."""

    policy: str
    gpus: int
    jobs: list[JobResult]
    busy_gpu_s: float  # GPU-seconds spent computing (whether or not the job later finished)
    switch_gpu_s: float  # GPU-seconds spent checkpointing and switching
    start_order: list[str]  # job keys in the order they first started
    events: int
    wall_s: float = 0.0
    waiting_s: float = 0.0  # time during which at least one job waited
    held_while_waiting_gpu_s: float = 0.0  # GPU-seconds held by jobs during that time
    window_s: float = 0.0  # the arrival window: first to last submit
    window_held_gpu_s: float = 0.0  # GPU-seconds held by running jobs within it
    # Admission control (clockq/replay/admission.py), when it was on
    held_jobs: int = 0  # jobs held on arrival while admission was closed
    admission_closures: int = 0
