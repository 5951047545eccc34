"""Checkpoints on their way to disk: one short-lived mark in Redis per persist in flight.

A worker hands the GPU over after the snapshot and writes the checkpoint in the background
(workers/persister.py). A worker that claims the job meanwhile finds the newest named file not
there yet, and must tell a writer that is still at it (wait for it) from one that is gone:
killed, frozen or cut off (fall back to the generation before at once, instead of holding a GPU
idle for the whole wait bound).

The writer sets the mark before the database names the file and deletes it once the file is
written. While the write lasts, its worker refreshes the mark; a worker that dies or freezes
stops refreshing, and the mark expires within TTL_S. Every GPU host shares the broker's Redis,
so a claim on one host sees the marks of writers on all of them.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

KEY_PREFIX = "clockq:persisting:"
TTL_S = 6  # a writer that stopped refreshing is taken for gone this long after
REFRESH_S = 2.0


def _key(job_id: int, name: str) -> str:
    return f"{KEY_PREFIX}{int(job_id)}:{name}"


def mark(r: redis.Redis, job_id: int, name: str, writer: str) -> None:
    """`writer` is about to name this checkpoint on the job, and will write it."""
    r.set(_key(job_id, name), writer, ex=TTL_S)


def unmark(r: redis.Redis, job_id: int, name: str) -> None:
    """Written, or never will be (superseded, discarded, failed)."""
    r.delete(_key(job_id, name))


def refresh(r: redis.Redis, marks: Iterable[tuple[int, str]]) -> None:
    """The writer is still at these."""
    pipe = r.pipeline(transaction=False)
    for job_id, name in marks:
        pipe.expire(_key(job_id, name), TTL_S)
    pipe.execute()


def writer_of(r: redis.Redis, job_id: int, name: str) -> str | None:
    """Who is writing this checkpoint, or None when nobody is (any more)."""
    raw = r.get(_key(job_id, name))
    if raw is None:
        return None
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
