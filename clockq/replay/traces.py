"""Read a job trace from a CSV file into a Trace the replay engine can run.

Three formats: the Alibaba OpenB 2023 pod list, the Tiresias simulator's job list, and a plain
csv of our own. Every row either becomes a TraceJob, is counted in Trace.skipped with a reason
(it describes no GPU job), or stops the load with a TraceError naming its line and column: a
replay of a half-read or misread trace would report numbers that mean nothing.

Standard library only (plus clockq.policy): the replay runs without Django, Celery or Redis.
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import NoReturn

from clockq.policy.tiers import BK, BP, HP, RT, SP, TIERS, TierSpec
from clockq.replay.model import Trace, TraceError, TraceJob

FORMATS = ("alibaba", "tiresias", "csv")
MAX_ROWS = 5_000_000  # far above any trace we replay; beyond it the file is not what we think it is

# Tiresias trace: parameters (millions) of each model, for its checkpoint size.
MODEL_PARAMS_M = {
    "vgg19": 143.7,
    "vgg16": 138.4,
    "vgg11": 132.9,
    "alexnet": 61.1,
    "resnet50": 25.6,
    "resnet101": 44.5,
    "resnet152": 60.2,
    "inception3": 27.2,
    "inception4": 42.7,
    "googlenet": 6.6,
}
# A checkpoint holds the weights and SGD momentum: two float32 values per parameter.
BYTES_PER_PARAM = 2 * 4
TIRESIAS_HP_GPU_S = 900.0  # gpu_time (num_gpu * duration) up to 15 GPU-minutes: fine-tuning size
TIRESIAS_SP_GPU_S = 8 * 3600.0  # up to 8 GPU-hours: standard training; beyond: batch

SKIP_NO_GPU = "no GPU requested"
SKIP_NEVER_STARTED = "never started in the trace, so its run time is unknown"
SKIP_NO_RUN_TIME = "deleted no later than it was scheduled, so it never ran"


@dataclass
class _Row:
    """One data row, with parsers that name the file, line and column when a value is bad."""

    path: str
    line: int
    values: dict[str, str]

    def fail(self, column: str | None, message: str) -> NoReturn:
        raise TraceError(self.path, self.line, column, message)

    def text(self, column: str) -> str:
        return self.values.get(column, "")  # an absent optional column reads as empty

    def key(self, column: str) -> str:
        value = self.text(column)
        if not value:
            self.fail(column, "empty value: each job needs a name")
        return value

    def number(self, column: str, *, positive: bool = False) -> float:
        """A finite number >= 0 (> 0 with positive): every number in these traces is a time,
        a duration or a size."""
        raw = self.text(column)
        if not raw:
            self.fail(column, "empty value where a number is needed")
        try:
            value = float(raw)
        except ValueError:
            self.fail(column, f"{raw!r} is not a number")
        if not math.isfinite(value):
            self.fail(column, f"{raw!r} is not a finite number")
        if value < 0:
            self.fail(column, f"{raw!r} is negative")
        if positive and value == 0:
            self.fail(column, "must be greater than 0")
        return value

    def count(self, column: str, *, zero_ok: bool = False) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            self.fail(column, f"{raw!r} is not a whole number")
        if value < 0 or (value == 0 and not zero_ok):
            self.fail(column, f"{raw!r} is not a positive whole number")
        return value


@dataclass
class _Job:
    """What a format reads from one row, in the trace's own (unscaled) seconds."""

    key: str
    duration: float
    num_gpu: int
    tier: str
    checkpoint_mb: float
    avg_util: float | None = None
    deadline_after_submit: float | None = None  # the trace's own deadline, if it gives one
    user: str = ""  # who submitted it, where the format says (fair share between users)
    note: str | None = None  # a mapping remark worth counting (e.g. an unknown model)


# A format reads a row (given its submit time) into a job, or into a reason to skip it.
_Parse = Callable[[_Row, float, float], _Job | str]


def _alibaba(row: _Row, submit: float, checkpoint_mb: float) -> _Job | str:
    num_gpu = row.count("num_gpu", zero_ok=True)
    if num_gpu == 0:
        return SKIP_NO_GPU  # a CPU-only pod
    if not row.text("scheduled_time"):
        return SKIP_NEVER_STARTED  # still pending when the trace was taken
    start, end = row.number("scheduled_time"), row.number("deletion_time")
    if end <= start:
        return SKIP_NO_RUN_TIME
    milli = row.number("gpu_milli", positive=True)
    shared = milli < 1000
    qos = row.text("qos")
    if qos == "LS":
        tier = RT.code if shared else HP.code
    elif qos == "Guaranteed":
        tier = HP.code
    elif qos == "Burstable":
        tier = SP.code
    elif qos == "BE":
        tier = BK.code if shared else BP.code
    else:
        row.fail("qos", f"unknown qos {qos!r}; expected LS, Guaranteed, Burstable or BE")
    return _Job(row.key("name"), end - start, num_gpu, tier, checkpoint_mb, avg_util=min(milli / 1000, 1.0))


ALIBABA_MAPPING = [
    "arrival = creation_time; run time = deletion_time - scheduled_time, whatever the pod_phase "
    "(a failed pod held its GPUs too; a pod still running when the trace ends is cut there)",
    "qos LS with gpu_milli < 1000 (a shared GPU: latency-sensitive inference) -> RT",
    "qos LS with whole GPUs -> HP",
    "qos Guaranteed -> HP",
    "qos Burstable -> SP",
    "qos BE with whole GPUs -> BP",
    "qos BE with gpu_milli < 1000 -> BK",
    "a pod with gpu_milli < 1000 still holds num_gpu whole GPUs here: clockq time-slices whole GPUs "
    "and does not pack fractions; its GPU share gpu_milli/1000 stands in for avg_util (slice planning)",
    "pods with num_gpu 0, never scheduled, or deleted no later than scheduled are skipped, by reason",
]


def _tiresias(row: _Row, submit: float, checkpoint_mb: float) -> _Job | str:
    num_gpu = row.count("num_gpu")
    duration = row.number("duration", positive=True)
    gpu_s = num_gpu * duration  # the trace's own seconds: the tier does not move with duration_scale
    tier = HP.code if gpu_s <= TIRESIAS_HP_GPU_S else SP.code if gpu_s <= TIRESIAS_SP_GPU_S else BP.code
    model = row.text("model_name")
    params_m = MODEL_PARAMS_M.get(model.lower())
    note = None
    if params_m is None:
        note = f"model {model!r} is not in the size table: checkpoint_mb = the default"
    else:
        checkpoint_mb = params_m * BYTES_PER_PARAM  # millions of parameters * bytes = MB
    return _Job(row.key("job_id"), duration, num_gpu, tier, checkpoint_mb, note=note)


TIRESIAS_MAPPING = [
    "arrival = submit_time; run time = duration",
    f"tier by gpu_time = num_gpu * duration (trace seconds): <= {TIRESIAS_HP_GPU_S:g} GPU-s -> HP, "
    f"<= {TIRESIAS_SP_GPU_S / 3600:g} GPU-hours -> SP, else BP",
    "checkpoint_mb = weights + SGD momentum = 2 * parameters * 4 bytes, from model_name "
    "(vgg19 143.7M parameters -> 1149.6 MB); a model not in the table gets the checkpoint_mb default",
]


def _make_csv(tier_codes: Sequence[str]) -> _Parse:
    def parse(row: _Row, submit: float, checkpoint_mb: float) -> _Job | str:
        key = row.key("job_id") if "job_id" in row.values else row.key("name") if "name" in row.values else None
        tier = row.text("tier").upper()
        if tier not in tier_codes:
            row.fail("tier", f"unknown tier {row.text('tier')!r}; expected one of {', '.join(tier_codes)}")
        after = None
        if row.text("deadline"):
            deadline = row.number("deadline")
            if deadline < submit:
                row.fail("deadline", f"deadline {deadline:g} is before the submit time {submit:g}")
            after = deadline - submit
        if row.text("checkpoint_mb"):
            checkpoint_mb = row.number("checkpoint_mb")
        return _Job(
            key or str(row.line),
            row.number("duration", positive=True),
            row.count("num_gpu"),
            tier,
            checkpoint_mb,
            deadline_after_submit=after,
            user=row.text("user"),
        )

    return parse


CSV_MAPPING = [
    "arrival = submit_time; run time = duration; tier as given (upper-cased)",
    "a deadline given in the file is absolute trace time: its offset from submit_time is kept, "
    "divided by duration_scale; an empty deadline cell is derived like a missing one",
    "key = job_id, else name, else the line number; checkpoint_mb from its column, else the default",
    "user from its column, if any (fair share between the users of a tier)",
]


def _rows(path: str, required: Sequence[str]) -> Iterator[_Row]:
    """The file's data rows, after checking the header names every required column."""
    try:
        f = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 (a generator holds it open)
    except OSError as e:
        raise TraceError(path, None, None, f"cannot read the file: {e.strerror or e}") from e
    with f:
        reader = csv.reader(f)
        try:
            header = [name.strip() for name in next(reader, [])]
            if not any(header):
                raise TraceError(path, None, None, "the file is empty (no header line)")
            for column in required:
                if column not in header:
                    raise TraceError(path, 1, column, "missing column")
            count = 0
            for fields in reader:
                if not fields:
                    continue  # a blank line
                count += 1
                if count > MAX_ROWS:
                    raise TraceError(path, reader.line_num, None, f"more than {MAX_ROWS:,} rows")
                if len(fields) != len(header):
                    raise TraceError(
                        path, reader.line_num, None, f"{len(fields)} fields where the header has {len(header)}"
                    )
                yield _Row(path, reader.line_num, {k: v.strip() for k, v in zip(header, fields, strict=True)})
        except csv.Error as e:
            raise TraceError(path, reader.line_num or None, None, f"not a readable CSV file: {e}") from e
        except UnicodeDecodeError as e:
            # The decoder reads ahead of the csv reader, so no line number would be honest here.
            raise TraceError(path, None, None, f"not UTF-8 text: {e.reason}") from e
        if count == 0:
            raise TraceError(path, None, None, "no rows after the header")


_FORMAT_COLUMNS = {  # submit column, then the other required columns
    "alibaba": ("creation_time", "name", "num_gpu", "gpu_milli", "qos", "scheduled_time", "deletion_time"),
    "tiresias": ("submit_time", "job_id", "num_gpu", "model_name", "duration"),
    "csv": ("submit_time", "duration", "num_gpu", "tier"),
}
_FORMAT_TIERS = {
    "alibaba": tuple(t.code for t in (RT, HP, SP, BP, BK)),
    "tiresias": tuple(t.code for t in (HP, SP, BP)),
}


def _check_arguments(
    arrival_scale: float, duration_scale: float, until_s: float | None, slack: float, checkpoint_mb: float
) -> None:
    # `not x > 0` also refuses NaN.
    if not (math.isfinite(arrival_scale) and arrival_scale > 0):
        raise ValueError(f"arrival_scale must be a finite number > 0, not {arrival_scale!r}")
    if not (math.isfinite(duration_scale) and duration_scale > 0):
        raise ValueError(f"duration_scale must be a finite number > 0, not {duration_scale!r}")
    if until_s is not None and not until_s > 0:
        raise ValueError(f"until_s must be > 0 (or None for the whole trace), not {until_s!r}")
    if not (math.isfinite(slack) and slack >= 0):
        raise ValueError(f"slack must be a finite number >= 0, not {slack!r}")
    if not (math.isfinite(checkpoint_mb) and checkpoint_mb >= 0):
        raise ValueError(f"checkpoint_mb must be a finite number >= 0, not {checkpoint_mb!r}")


def load(
    path: str,
    fmt: str,
    *,
    arrival_scale: float = 1.0,
    duration_scale: float = 1.0,
    until_s: float | None = None,
    slack: float = 2.0,
    checkpoint_mb: float = 100.0,
    tiers: Sequence[TierSpec] = TIERS,
) -> Trace:
    """Read the trace at `path` in format `fmt` (one of FORMATS).

    Times are divided by the scales (arrival_scale 10: arrivals ten times denser); only jobs whose
    scaled submit time is before until_s are read. A job without a deadline of its own gets
    submit + its tier's wait target + slack * duration; a tier without a wait target, none.
    """
    _check_arguments(arrival_scale, duration_scale, until_s, slack, checkpoint_mb)
    if fmt not in FORMATS:
        raise TraceError(path, None, None, f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    by_code = {t.code: t for t in tiers}
    missing = [code for code in _FORMAT_TIERS.get(fmt, ()) if code not in by_code]
    if missing:
        raise ValueError(f"the {fmt} mapping needs tiers {', '.join(missing)}, which `tiers` lacks")
    parse: _Parse = {"alibaba": _alibaba, "tiresias": _tiresias}.get(fmt) or _make_csv(tuple(by_code))
    submit_column, *_ = columns = _FORMAT_COLUMNS[fmt]

    jobs: list[TraceJob] = []
    skipped: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    seen: dict[str, int] = {}  # key -> line: the engine and the report name jobs by key
    previous = -math.inf
    for row in _rows(path, columns):
        submit = row.number(submit_column)
        if submit < previous:
            row.fail(submit_column, f"{submit:g} is before the row above ({previous:g}): rows must be in submit order")
        previous = submit
        submit_s = submit / arrival_scale
        if until_s is not None and submit_s >= until_s:
            break  # rows are in submit order: no later row can qualify
        job = parse(row, submit, checkpoint_mb)
        if isinstance(job, str):
            skipped[job] += 1
            continue
        if job.key in seen:
            row.fail(None, f"job {job.key!r} appears twice (first on line {seen[job.key]})")
        seen[job.key] = row.line
        if job.note:
            notes[job.note] += 1
        wait_ms = by_code[job.tier].wait_target_ms
        jobs.append(
            _trace_job(
                job,
                line=row.line,
                submit_s=submit_s,
                duration_scale=duration_scale,
                slack=slack,
                wait_target_ms=wait_ms,
            )
        )
    if not jobs:
        reason = f" (only rows submitted before until_s={until_s:g} s were read)" if until_s is not None else ""
        raise TraceError(path, None, None, f"no GPU job to replay{reason}; skipped: {dict(skipped) or 'none'}")
    mapping = _mapping(
        fmt,
        notes=notes,
        arrival_scale=arrival_scale,
        duration_scale=duration_scale,
        until_s=until_s,
        slack=slack,
        checkpoint_mb=checkpoint_mb,
    )
    # Reading in file order already sorts by submit time: out-of-order rows were refused above.
    return Trace(name=os.path.basename(path), jobs=jobs, skipped=dict(skipped), mapping=mapping)


def _trace_job(
    job: _Job, *, line: int, submit_s: float, duration_scale: float, slack: float, wait_target_ms: int | None
) -> TraceJob:
    """A parsed row in scaled trace seconds, with its deadline: the trace's own, else submit + its
    tier's wait target + slack * duration, else (a best-effort tier) none."""
    duration_s = job.duration / duration_scale
    if job.deadline_after_submit is not None:
        deadline_s: float | None = submit_s + job.deadline_after_submit / duration_scale
    elif wait_target_ms is not None:
        deadline_s = submit_s + wait_target_ms / 1000 + slack * duration_s
    else:
        deadline_s = None
    return TraceJob(
        key=job.key,
        line=line,
        submit_s=submit_s,
        duration_s=duration_s,
        num_gpu=job.num_gpu,
        tier=job.tier,
        deadline_s=deadline_s,
        checkpoint_mb=job.checkpoint_mb,
        avg_util=job.avg_util,
        user=job.user,
    )


def _mapping(
    fmt: str,
    *,
    notes: Counter[str],
    arrival_scale: float,
    duration_scale: float,
    until_s: float | None,
    slack: float,
    checkpoint_mb: float,
) -> list[str]:
    """How rows became jobs, tiers, times and deadlines, in words, stated with every result."""
    mapping = {"alibaba": ALIBABA_MAPPING, "tiresias": TIRESIAS_MAPPING, "csv": CSV_MAPPING}[fmt]
    if fmt == "alibaba":
        mapping = [*mapping, f"checkpoint_mb = {checkpoint_mb:g} for every job: the trace says nothing of state size"]
    mapping = [
        *mapping,
        *(f"{n} job(s): {note}" for note, n in sorted(notes.items())),
        f"times: submit = trace submit / {arrival_scale:g}, duration = trace duration / {duration_scale:g}",
        f"deadline where the trace gives none: submit + tier wait target + {slack:g} * duration; "
        "a tier without a wait target (best effort): no deadline",
    ]
    if until_s is not None:
        mapping.append(f"only jobs submitted before {until_s:g} s (scaled) were read")
    return mapping


def check_fits(trace: Trace, gpus: int, path: str) -> None:
    """Refuse a trace whose first too-large job could never start on `gpus` GPUs: it would wait forever."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, not {gpus!r}")
    for job in trace.jobs:
        if job.num_gpu > gpus:
            raise TraceError(
                path, job.line, "num_gpu", f"job {job.key!r} needs {job.num_gpu} GPUs; the replay has only {gpus}"
            )
