"""Atomic, verified checkpoints on disk, two generations deep.

A file is `MAGIC`, one JSON header line, then the payload. The header carries the payload's
length and CRC-32, so a torn or corrupted file is detected on restore and the previous
generation is used instead. (CRC-32 detects accidental damage, which is all it guards against
here, at a third of SHA-256's cost: 0.15 ms against 0.5 ms per MB on this machine.)
Writes go to a temporary file that is fsynced, then renamed.
With many GPU hosts, CLOCKQ_CHECKPOINT_DIR must be shared storage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

from clockq.jobs.quotas import KEPT_GENERATIONS
from clockq.jobs.results import RESULT_DIR

log = logging.getLogger("clockq.checkpoints")

MAGIC = b"CLOCKQ-CKPT-2\n"
# One number for the store and for the storage quota, which counts what the store keeps.
KEEP_GENERATIONS = KEPT_GENERATIONS


class CheckpointError(Exception):
    """A checkpoint file is missing, torn or corrupt: restore falls back to the one before."""


class StorageError(Exception):
    """The checkpoint storage itself failed (full, read-only, I/O error, permissions). It says
    nothing about the job or its checkpoints, so it is neither a fallback reason nor the job's
    failure: the job goes back to its queue from its last good checkpoint."""


@dataclass(frozen=True)
class Restored:
    generation: int  # 0 means no checkpoint: start from the beginning
    state: bytes | None
    skipped: tuple[str, ...] = ()  # why newer generations were rejected


class CheckpointStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def job_dir(self, job_id: int) -> Path:
        return self.root / str(int(job_id))

    def path(self, job_id: int, generation: int) -> Path:
        return self.job_dir(job_id) / f"gen-{generation:08d}.ckpt"

    def work_dir(self, job_id: int) -> Path:
        """Scratch space a workload may keep across requeues (outside the checkpoint)."""
        path = self.job_dir(job_id) / "work"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create {path}: {exc}") from exc
        return path

    def write(self, job_id: int, generation: int, state: bytes) -> int:
        """Durably write one generation and prune older ones. Returns the bytes written.
        Raises StorageError, leaving no partial file behind, when the storage fails."""
        directory = self.job_dir(job_id)
        header = json.dumps(
            {
                "job": int(job_id),
                "generation": generation,
                "length": len(state),
                "crc32": zlib.crc32(state),
            }
        ).encode()
        final = self.path(job_id, generation)
        tmp = final.with_suffix(f".tmp-{os.getpid()}")
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(MAGIC)
                fh.write(header + b"\n")
                fh.write(state)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            _fsync_dir(directory)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise StorageError(f"writing checkpoint {final.name} of job {job_id}: {exc}") from exc
        self._prune(job_id, keep_from=generation - KEEP_GENERATIONS + 1)
        return len(MAGIC) + len(header) + 1 + len(state)

    def read(self, job_id: int, generation: int) -> bytes:
        """Read and verify one generation, or raise CheckpointError saying what is wrong with
        it, or StorageError when the storage cannot be read at all."""
        path = self.path(job_id, generation)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{path.name} is missing") from None
        except OSError as exc:
            raise StorageError(f"reading {path.name} of job {job_id}: {exc}") from exc
        if not data.startswith(MAGIC):
            raise CheckpointError(f"{path.name} has no clockq header")
        end = data.find(b"\n", len(MAGIC))
        try:
            header = json.loads(data[len(MAGIC) : end])
        except ValueError:
            raise CheckpointError(f"{path.name} has an unreadable header") from None
        payload = data[end + 1 :]
        if header.get("job") != int(job_id) or header.get("generation") != generation:
            raise CheckpointError(f"{path.name} belongs to job {header.get('job')} gen {header.get('generation')}")
        if len(payload) != header.get("length"):
            raise CheckpointError(f"{path.name} is truncated: {len(payload)} of {header.get('length')} bytes")
        if zlib.crc32(payload) != header.get("crc32"):
            raise CheckpointError(f"{path.name} fails its checksum")
        return payload

    def restore(self, job_id: int, generation: int) -> Restored:
        """The newest good generation at or below `generation`, falling back one at a time."""
        skipped: list[str] = []
        for gen in range(generation, max(generation - KEEP_GENERATIONS, 0), -1):
            try:
                return Restored(gen, self.read(job_id, gen), tuple(skipped))
            except CheckpointError as exc:
                log.warning("job %s: checkpoint generation %s rejected: %s", job_id, gen, exc)
                skipped.append(str(exc))
        return Restored(0, None, tuple(skipped))

    def delete_job(self, job_id: int) -> None:
        """Delete everything kept for a job but its result: its checkpoints, its work folder and
        any staging left by a crash. The result (clockq/jobs/results.py) has its own retention."""
        try:
            entries = list(self.job_dir(job_id).iterdir())
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(f"listing the checkpoints of job {job_id}: {exc}") from exc
        try:
            for entry in entries:
                if entry.name == RESULT_DIR:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink(missing_ok=True)
            if not any(self.job_dir(job_id).iterdir()):
                self.job_dir(job_id).rmdir()
        except OSError as exc:
            raise StorageError(f"deleting the checkpoints of job {job_id}: {exc}") from exc

    def _prune(self, job_id: int, keep_from: int) -> None:
        """Delete generations older than `keep_from`; best effort, the next write tries again."""
        for path in self.job_dir(job_id).glob("gen-*.ckpt"):
            try:
                gen = int(path.stem.split("-")[1])
            except (IndexError, ValueError):
                continue
            if gen < keep_from:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("job %s: could not delete old checkpoint %s: %s", job_id, path.name, exc)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
