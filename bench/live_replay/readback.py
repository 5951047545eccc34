"""Submission and read-back: every job POSTed at its time, polled until all have ended, and read
back from its history as a LiveJob; then /api/kpis for the run's window."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bench.live_replay.api import Client, LiveError, parse_time
from bench.live_replay.plan import LivePlan
from clockq.policy.states import TERMINAL_STATES

HISTORY_CAP = 500  # GET /api/jobs/<id>?history=1 returns at most this many slices and events
TERMINAL = frozenset(s.value for s in TERMINAL_STATES)

Progress = Callable[[str], None]


@dataclass
class Submitted:
    key: str
    id: int
    planned_s: float  # its submit time in the converted trace (live seconds from the first)
    sent_s: float  # when it was sent, by this process's clock, from the first submission's plan
    submitted_at: datetime  # the server's own record


def submit_all(
    client: Client,
    plan: LivePlan,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Progress | None = None,
    submitted: list[Submitted] | None = None,
) -> list[Submitted]:
    """POST every job at its submit time, from a loop on the monotonic clock. A job whose time
    came while an earlier POST was in flight goes at once (its lag shows in sent_s). Jobs are
    appended to `submitted` as they go, so a caller can cancel them if this raises."""
    done = submitted if submitted is not None else []
    t0 = clock()
    for job, body in zip(plan.trace.jobs, plan.bodies, strict=True):
        delay = t0 + job.submit_s - clock()
        if delay > 0:
            sleep(delay)
        sent = clock() - t0
        try:
            answer = client.submit(body)
        except LiveError as exc:
            raise LiveError(f"submitting job {job.key!r} (line {job.line}): {exc}") from exc
        done.append(Submitted(job.key, int(answer["id"]), job.submit_s, sent, parse_time(answer["submitted_at"])))
        if progress and (len(done) % 10 == 0 or len(done) == len(plan.bodies)):
            progress(f"submitted {len(done)}/{len(plan.bodies)}, {sent - job.submit_s:+.2f} s from plan")
    return done


def wait_for_all(
    client: Client,
    submitted: Sequence[Submitted],
    *,
    timeout_s: float,
    since: float | None = None,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Progress | None = None,
) -> dict[int, dict[str, Any]]:
    """Poll until every job has ended; then each job with its slices and events, by id. Past
    `timeout_s` from `since` (a `clock` reading; default: now), a LiveError naming every job
    still unfinished, with its state and progress."""
    deadline = (clock() if since is None else since) + timeout_s
    pending = {s.id: s for s in submitted}
    reported = -1
    while True:
        late = clock() >= deadline
        unfinished: dict[int, dict[str, Any]] = {}
        for job_id in list(pending):
            answer = client.job(job_id)
            if answer["state"] in TERMINAL:
                del pending[job_id]
                continue
            unfinished[job_id] = answer
            if not late:
                break  # one unfinished job is enough to wait on: the rest next round
        if not pending:
            break
        if late:
            left = [f"{s.key} (id {s.id}, {_state(unfinished[s.id])})" for s in pending.values()]
            raise LiveError(f"{len(left)} job(s) still unfinished after {timeout_s:.0f} s: {', '.join(left)}")
        if progress and len(pending) != reported:
            reported = len(pending)
            progress(f"waiting for {len(pending)} of {len(submitted)} job(s) to end")
        sleep(max(min(poll_s, deadline - clock()), 0.0))
    return {s.id: client.job(s.id, history=True) for s in submitted}


@dataclass
class LiveJob:
    """One job as the live system ran it. Times are the server's."""

    key: str
    id: int
    tier: str  # its own (original) tier
    state: str
    planned_s: float
    submitted_at: datetime
    first_start: datetime | None
    finished_at: datetime | None
    busy_s: float  # computing: the slices' used_ms
    held_s: float | None  # holding its GPU: the slices' wall time (None: history capped)
    yields: int  # times it left its GPU before the end (running -> queued)
    promotions: int
    holds: int = 0  # times it was held (admission closed, an operator's hold): the simulator holds none

    @property
    def wait_s(self) -> float | None:
        return None if self.first_start is None else (self.first_start - self.submitted_at).total_seconds()


def live_job(s: Submitted, answer: dict[str, Any]) -> LiveJob:
    """From GET /api/jobs/<id>?history=1: the first start is the first queued -> running event
    (else first_started_at, if the event list was capped), busy time the slice history's used_ms
    (else run_ms, the same sum kept on the job, if the slice list was capped)."""
    events = answer.get("events") or []
    slices = answer.get("slice_history") or []
    first_start = next(
        (parse_time(e["at"]) for e in events if e["from_state"] == "queued" and e["to_state"] == "running"), None
    )
    if first_start is None and answer.get("first_started_at"):
        first_start = parse_time(answer["first_started_at"])
    complete = len(slices) == answer.get("slices", len(slices)) and len(slices) < HISTORY_CAP
    if complete:
        busy = sum(x["used_ms"] for x in slices) / 1000.0
        held: float | None = sum(
            (parse_time(x["ended_at"]) - parse_time(x["started_at"])).total_seconds() for x in slices
        )
    else:
        busy, held = answer.get("run_ms", 0) / 1000.0, None
    return LiveJob(
        key=s.key,
        id=s.id,
        tier=answer.get("original_tier") or answer.get("tier", ""),
        state=answer["state"],
        planned_s=s.planned_s,
        submitted_at=parse_time(answer.get("submitted_at")) or s.submitted_at,
        first_start=first_start,
        finished_at=parse_time(answer.get("finished_at")),
        busy_s=busy,
        held_s=held,
        yields=sum(1 for e in events if e["from_state"] == "running" and e["to_state"] == "queued"),
        promotions=sum(
            1
            for e in events
            if e["from_state"] == e["to_state"] == "queued"
            and str(e.get("reason", "")).startswith(("promoted", "batch chance"))
        ),
        holds=sum(1 for e in events if e["to_state"] == "held" and e["from_state"] != "held"),
    )


def fetch_kpis(
    client: Client,
    since: datetime,
    until: datetime,
    *,
    wait_s: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """/api/kpis for [since, until), waiting up to `wait_s` for the rollup (beat, every 60 s)
    to cover the window's last minute. Returns the answer, or {"error": ...}: the KPIs are a
    cross-check, and a comparison should not be lost to them."""
    deadline = clock() + wait_s
    end = _ceil_minute(until)
    while True:
        try:
            answer = client.kpis(since, until)
        except LiveError as exc:
            return {"error": str(exc)}
        rolled = parse_time(answer.get("rolled_up_until"))
        if (rolled is not None and rolled >= end) or clock() >= deadline:
            answer["covered"] = rolled is not None and rolled >= end
            return answer
        sleep(min(5.0, max(deadline - clock(), 0.0)))


def _state(answer: dict[str, Any]) -> str:
    return f"{answer['state']}, progress {answer.get('progress', 0.0):.0%}"


def _ceil_minute(when: datetime) -> datetime:
    floor = when.replace(second=0, microsecond=0)
    return floor if floor == when else floor + timedelta(minutes=1)
