"""What a finished job produced: its result files, kept apart from its checkpoints.

A workload writes its result into a staging folder; `store()` checks every file (regular files
only, plain names, bounded count), hashes and fsyncs them, writes a manifest, and then renames
the folder into place in one step. So a job's `result/` folder is either absent or complete:
a crash before the rename leaves only a staging folder, which the next store of the same job
removes. The worker marks the job `succeeded` only after `store()` returned, so a crash in
between means the job resumes and finishes again, never that it succeeds without its result.

Workers write results; the web process reads them for download. Both find them under
CLOCKQ_CHECKPOINT_DIR/<job id>/result (shared storage when there are several hosts).
Checkpoint retention deletes a job's checkpoints and work folder, never this folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from clockq.durable import fsync_dir

RESULT_DIR = "result"
MANIFEST = "manifest.json"
MAX_FILES = 100
# A file name a user may download: no folders, no hidden files, nothing a shell or a browser
# would read as something else.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


class ResultError(Exception):
    """The workload's result is not acceptable (a link, a folder, a bad name, too many files):
    the job's fault, reported as its failure."""


class ResultStorageError(Exception):
    """The storage failed while the result was written or read: not the job's fault."""


@dataclass(frozen=True)
class ResultFile:
    name: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    files: tuple[ResultFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def as_json(self) -> list[dict]:
        return [asdict(f) for f in self.files]

    def file(self, name: str) -> ResultFile | None:
        return next((f for f in self.files if f.name == name), None)


class ResultStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    def folder(self, job_id: int) -> Path:
        return self.root / str(int(job_id)) / RESULT_DIR

    def staging(self, job_id: int) -> Path:
        """An empty folder for the workload to write its result into."""
        path = self.root / str(int(job_id)) / f"{RESULT_DIR}.staging-{os.getpid()}"
        try:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)
        except OSError as exc:
            raise ResultStorageError(f"cannot create {path}: {exc}") from exc
        return path

    def store(self, job_id: int, staged: Path) -> Manifest:
        """Check, hash and fsync the staged files, then put them in place of any earlier result
        of this job in one rename. Raises ResultError for a result the job must not give, and
        ResultStorageError when the storage fails."""
        manifest = Manifest(tuple(_check_and_hash(staged)))
        final = self.folder(job_id)
        try:
            _write_synced(staged / MANIFEST, json.dumps({"files": manifest.as_json()}).encode())
            fsync_dir(staged)
            if final.exists():
                # Finished again after a crash (or requeued by an operator): the newer result wins.
                old = final.with_name(f"{RESULT_DIR}.old-{os.getpid()}")
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
                os.replace(staged, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staged, final)
            fsync_dir(final.parent)
        except OSError as exc:
            raise ResultStorageError(f"storing the result of job {job_id}: {exc}") from exc
        for stale in final.parent.glob(f"{RESULT_DIR}.staging-*"):  # left by a crashed worker
            shutil.rmtree(stale, ignore_errors=True)
        return manifest

    def manifest(self, job_id: int) -> Manifest | None:
        try:
            data = json.loads((self.folder(job_id) / MANIFEST).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ResultStorageError(f"reading the result manifest of job {job_id}: {exc}") from exc
        return Manifest(tuple(ResultFile(**f) for f in data["files"]))

    def open(self, job_id: int, name: str) -> BinaryIO:
        """One file of the stored result, by a name its manifest lists (callers check that)."""
        if not SAFE_NAME.match(name) or name == MANIFEST:
            raise FileNotFoundError(name)
        return open(self.folder(job_id) / name, "rb")

    def delete(self, job_id: int) -> None:
        try:
            shutil.rmtree(self.folder(job_id))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ResultStorageError(f"deleting the result of job {job_id}: {exc}") from exc


def _check_and_hash(staged: Path) -> list[ResultFile]:
    """Every entry must be a regular file with a plain name; links are refused, not followed
    (a program's result folder is written by the program, which must not make the worker read
    a file of its choosing)."""
    try:
        entries = sorted(os.scandir(staged), key=lambda e: e.name)
    except OSError as exc:
        raise ResultStorageError(f"reading the staged result: {exc}") from exc
    if len(entries) > MAX_FILES:
        raise ResultError(f"a result holds at most {MAX_FILES} files; this one has {len(entries)}")
    files = []
    for entry in entries:
        if not SAFE_NAME.match(entry.name) or entry.name == MANIFEST:
            raise ResultError(f"result file name {entry.name[:60]!r} is not allowed (letters, digits, . _ -)")
        if not entry.is_file(follow_symlinks=False):
            raise ResultError(f"result entry {entry.name!r} is not a regular file (links and folders are refused)")
        files.append(_hash_synced(Path(entry.path)))
    return files


def _hash_synced(path: Path) -> ResultFile:
    digest, size = hashlib.sha256(), 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ResultError(f"result file {path.name!r} cannot be opened: {exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ResultError(f"result entry {path.name!r} is not a regular file")
        try:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
            os.fsync(fd)  # what the workload wrote is on disk before the result counts
        except OSError as exc:
            raise ResultStorageError(f"reading result file {path.name!r}: {exc}") from exc
    return ResultFile(path.name, size, digest.hexdigest())


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
