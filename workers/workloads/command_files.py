"""The files a command program shares with clockq in its work folder (workers/workloads/command.py
gives the protocol): its progress, metrics, checkpoint, result and kept logs. The program owns
the folder and may have swapped anything in it for a link, so each file is opened through the
folder's descriptor without following one (workers/job_folder.py)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from clockq.jobs import quotas
from clockq.jobs.results import MAX_FILES as MAX_RESULT_FILES
from clockq.jobs.results import SAFE_NAME as SAFE_RESULT_NAME
from clockq.jobs.results import ResultError
from workers.job_folder import JobFolder, UnsafeEntry

CHECKPOINT_NAME = "checkpoint"
PROGRESS_NAME = "progress"
STDOUT_NAME = "stdout.log"
STDERR_NAME = "stderr.log"
RESULT_DIR_NAME = "result"
METRICS_NAME = "metrics.jsonl"
METRICS_READ_BYTES = 1 << 20


class CheckpointTooBig(RuntimeError):
    """The program's checkpoint is bigger than the job may store, or than the store has room
    for: the job's failure, counted (the program may write a smaller one on its retry)."""


def read_progress(folder: JobFolder) -> float:
    """The progress the program wrote, in [0, 1]; 0 when there is none or it is not a number."""
    try:
        raw = folder.read(PROGRESS_NAME, limit=64)
        value = float((raw or b"").decode("utf-8", errors="replace").strip())
    except (OSError, ValueError):
        return 0.0
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def read_metrics(folder: JobFolder, offset: int) -> tuple[list[tuple[int, str, float]], int]:
    """The complete lines appended to the metrics file from `offset` on, at most
    METRICS_READ_BYTES of them, and the offset to read from next time. A line that is not a
    JSON object with an integer `step` is skipped."""
    try:
        fd = folder.open_file(METRICS_NAME)
    except OSError:
        return [], offset  # none yet (or a link, or not the job's: nothing is read through it)
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(METRICS_READ_BYTES)
    end = chunk.rfind(b"\n") + 1  # only whole lines; the rest is read next time
    records = []
    for line in chunk[:end].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(step := entry.pop("step", None), int):
            records += [(step, str(name), value) for name, value in entry.items()]
    return records, offset + end


def read_checkpoint(folder: JobFolder, too_big: Callable[[int], str]) -> bytes:
    """The checkpoint the program wrote, once its size (apparent: a sparse file is read whole)
    is known to fit what the job may store (`too_big(size)` says why not, '' when it fits): a
    bigger one is refused before a byte of it is read into the worker's memory."""
    try:
        fd = folder.open_file(CHECKPOINT_NAME)
    except UnsafeEntry as exc:
        raise RuntimeError(f"the program's {CHECKPOINT_NAME} cannot be used: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fd).st_size
        if reason := too_big(size):
            raise CheckpointTooBig(
                f"the program's {CHECKPOINT_NAME} ({size / quotas.MB:,.1f} MB, apparent size) cannot be "
                f"stored: {reason}"
            )
        data = fh.read(size)
    if not data:
        raise RuntimeError(f"the program wrote an empty {CHECKPOINT_NAME}")
    return data


def copy_result(folder: JobFolder, directory: Path, check_fits: Callable[[int], None]) -> None:
    """Copy the files the program left in its result folder into `directory`. Only the job's own
    regular files are copied: otherwise a link to a file only the worker may read would hand
    that file to the job's owner. `check_fits(total bytes)` raises when they may not be stored,
    before a byte is copied."""
    try:
        result = folder.subfolder(RESULT_DIR_NAME)
    except FileNotFoundError:
        return  # no result
    except OSError as exc:
        raise ResultError(f"{RESULT_DIR_NAME}/ in the work folder is not a folder: {exc}") from exc
    with result:
        names = sorted(result.names())
        if len(names) > MAX_RESULT_FILES:
            raise ResultError(f"a result holds at most {MAX_RESULT_FILES} files; {RESULT_DIR_NAME}/ has {len(names)}")
        sources = {}
        try:
            for name in names:
                if not SAFE_RESULT_NAME.match(name):
                    raise ResultError(f"result file name {name[:60]!r} is not allowed (letters, digits, . _ -)")
                try:
                    sources[name] = result.open_file(name)
                except OSError as exc:
                    raise ResultError(
                        f"result entry {name[:60]!r} cannot be read (links, folders and files not "
                        f"the job's own are refused): {exc.strerror or exc}"
                    ) from exc
            # Judged by what the copies will take (apparent sizes: a sparse file is copied
            # whole), before a byte is copied.
            sizes = {name: os.fstat(fd).st_size for name, fd in sources.items()}
            check_fits(sum(sizes.values()))
            for name, fd in sources.items():
                # A write that fails here is the store's (full, failing), not the job's: the
                # OSError goes up as it is, and the result writer says so. No more than was
                # judged is copied, whatever the file has become since.
                result.copy_fd_to(fd, directory / name, limit=sizes[name])
        finally:
            for fd in sources.values():
                os.close(fd)


def kept_log(folder: JobFolder, name: str, keep: int) -> bytes:
    """The end of what the program's earlier runs wrote to the log `name`, at most `keep` bytes,
    read through a descriptor (a link or a foreign file there gives nothing)."""
    try:
        fd = folder.open_file(name)
    except OSError:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, keep, max(0, size - keep))
    except OSError:
        return b""
    finally:
        os.close(fd)
