"""`clockq submit --wait`: follow submitted jobs until each has ended.

The API pushes nothing, so this polls, gently: one page of the owner's active jobs per round
(newest first, stopping once past the oldest job waited on), and a GET only for a job that has
left that list, to read how it ended. A batch of hundreds costs a few requests a round, not one
per job."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from clockq_cli import answers
from clockq_cli.client import Api
from clockq_cli.exits import CliError, ExitCode

ENDED = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
ACTIVE = "held,queued,running"
FIRST_POLL_S = 0.2
MAX_POLL_S = 2.0


def wait_until_ended(
    api: Api,
    jobs: list[dict[str, Any]],
    *,
    on_change: Callable[[dict[str, Any]], None],
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """The jobs as they ended, in the order given. `on_change` hears each job whose state moved."""
    latest = {job["id"]: job for job in jobs}
    waiting = {job["id"] for job in jobs if job["state"] not in ENDED}
    owner = jobs[0]["owner"] if jobs else ""
    delay = FIRST_POLL_S
    while waiting:
        sleep(delay)
        delay = min(delay * 1.5, MAX_POLL_S)
        active = _active_jobs(api, owner, oldest=min(waiting))
        for job_id in sorted(waiting):
            job = active.get(job_id) or api.get(api.job_path(job_id), shape=answers.JOB, what=f"job {job_id}")
            if job["state"] != latest[job_id]["state"]:
                on_change(job)
            latest[job_id] = job
            if job["state"] in ENDED:
                waiting.discard(job_id)
    return [latest[job["id"]] for job in jobs]


def _active_jobs(api: Api, owner: str, *, oldest: int) -> dict[int, dict[str, Any]]:
    """The owner's held, queued and running jobs with ids from `oldest` up. A job that moves
    while the pages are read may be missed here; the caller then reads it alone."""
    found: dict[int, dict[str, Any]] = {}
    try:
        for page in api.pages("/api/jobs", {"state": ACTIVE, "owner": owner}):
            found.update((job["id"], job) for job in page["results"])
            if not page["results"] or page["results"][-1]["id"] < oldest:
                break
    except CliError as exc:
        if exc.exit_code != ExitCode.NOT_FOUND:
            raise
        # The list shrank under us: that page is gone.
    return found
