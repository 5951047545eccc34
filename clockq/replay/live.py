"""Live mode: the simulator against reality.

`python manage.py replay TRACE --format F --gpus N --live URL` submits the trace's jobs to a
running clockq as `synthetic` jobs, time-compressed, reads each job's history back, and compares
it with the simulator's replay (clockq's policy) of the same jobs on the same number of GPUs:
start order, mean wait, GPU utilisation, and each job's first start side by side.

What runs live, and in the simulator (`convert`):

- **One GPU each.** The live system runs single-GPU jobs only: a multi-GPU (gang) job runs as a
  single-GPU job with the same duration. The simulator is given this same converted trace, so
  both sides see the same jobs; the comparison is of the scheduling, not of the gang model.
- **Compression.** `compress` divides arrivals and durations alike (trace seconds -> live
  seconds): x25 turns a 20-minute trace window into under a minute of arrivals. Arrivals are
  shifted so that the first job is submitted at 0.
- **Durations become steps**: steps = max(1, round(duration_s * 1000 / step_ms)) with a fixed
  step_ms (20 ms by default), and the simulator is given steps * step_ms as the duration, so both
  do the same work.
- **State.** state_kb = the job's checkpoint_mb in KB, capped at `state_kb_cap` (1024 KB by
  default): a compressed replay cannot afford GB checkpoints at every switch, so switches are
  cheaper than the trace's jobs would make them. The simulator prices switches for the capped
  size too.
- **Utilisation.** The synthetic job's gpu_util is the trace's avg_util where it has one, else
  0.9 (the workload's default); the simulator plans slices from the same figure.
- **No deadlines.** Deadlines are dropped on both sides: a compressed deadline of a few seconds
  would test the SLO check's 10 s tick rather than the schedule. Tier start timeouts (RT: 1 s)
  still apply on both sides.
- **Turns.** The simulator's quantum is one live slice (its rule max(quantum, S) gives S): live,
  jobs of a tier really take turns slice by slice, not in the default 60 s quanta.

Where the two usually differ, and why:

- **Switch and claim costs.** A live switch is a real checkpoint, a transition, a broker hop
  and a claim; the simulator uses the line through bench/switch_cost.py's medians (9.5 ms +
  1.2 ms/MB: 10.7 ms for 1 MB). Measured live on one machine with SQLite, a 1 MB switch cost
  some 43 ms (checkpoint 6, restore 2, the rest the requeue, hop and claim), so live slices,
  planned to keep switching within the 5 % overhead budget, were some 800 ms against the
  simulator's 214 ms, and a job arriving behind a queue of its own tier waited longer for its
  turn. `--switch-cost-factor 4` prices switches as measured. A job's first start pays the hop
  and the claim even on an idle GPU, so live waits are never 0.
- **Boundaries and steps.** Every live slice boundary, a continued one included, writes the job
  and a Slice row (about 9 ms here), and a slice ends at the first step boundary after its
  budget (20 ms steps; an RT interrupt, at the next step). A job that never switched runs in
  50-60 ms slices and takes 15-20 % longer than steps * step_ms; after its first switch its
  slices follow its measured switch cost and the overrun falls to about 1 %. A job that waits
  for a GPU waits out the overrun of the job before it.
- **Beat's ticks.** Promotions (and batch chances) happen at beat's 10 s ticks on the wall
  clock; the simulator ticks on a 10 s grid from its time 0. Their phases differ by up to 10 s,
  so a promoted job may start up to one tick earlier or later.
- **Random choices.** Which running job an RT job cuts short is random on both sides, and not
  the same draw.
- **The one-GPU conversion** changes a gang trace's load; both sides carry that change, but the
  numbers are not those of the original trace.
- **Other work.** Jobs that other users run on the cluster meanwhile take GPUs the simulator
  does not know of (a warning says when the queues were not empty at the start); the KPIs of
  /api/kpis count every job in their window, in whole minutes.

Plain Python: the standard library, `requests`, clockq.replay and clockq.policy. The API token
comes from the environment (CLOCKQ_API_TOKEN; `python manage.py createtoken USER` makes one),
never from the command line, where other users could read it.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from clockq.policy.states import TERMINAL_STATES
from clockq.replay.engine import Config
from clockq.replay.model import RunResult, Trace
from clockq.replay.policies import replay

TOKEN_ENV = "CLOCKQ_API_TOKEN"
DEFAULT_STEP_MS = 20.0
DEFAULT_STATE_KB_CAP = 1024
DEFAULT_GPU_UTIL = 0.9  # the synthetic workload's own default
LIVE_QUANTUM_S = 1e-3  # below any live slice: the simulator's turns last one live slice S
MAX_STEPS = 10_000_000  # the synthetic workload's limits (clockq/jobs/workloads.py)
MAX_STEP_MS = 60_000.0
MAX_STATE_KB = 1_048_576
NAME_MAX = 200  # Job.name
HISTORY_CAP = 500  # GET /api/jobs/<id>?history=1 returns at most this many slices and events
TERMINAL = frozenset(s.value for s in TERMINAL_STATES)

Progress = Callable[[str], None]


class LiveError(RuntimeError):
    """The live run could not be done or read back; the message says what and which jobs."""


# --- what the live system runs -----------------------------------------------------------------


@dataclass(frozen=True)
class LivePlan:
    """The converted trace (what both sides run, in live seconds) and one POST body per job."""

    trace: Trace
    bodies: list[dict[str, Any]]
    compress: float
    step_ms: float
    state_kb_cap: int
    multi_gpu_jobs: int  # jobs that asked for more than one GPU in the original trace
    capped_state_jobs: int  # jobs whose state was cut to state_kb_cap


def convert(
    trace: Trace,
    *,
    compress: float = 1.0,
    step_ms: float = DEFAULT_STEP_MS,
    state_kb_cap: int = DEFAULT_STATE_KB_CAP,
    name_prefix: str = "replay",
) -> LivePlan:
    """Turn `trace` into what the live system can run, and the same jobs for the simulator.

    Each job gets num_gpu = 1: **multi-GPU jobs run as single-GPU jobs with the same duration**
    (the live system runs single-GPU jobs only), and the simulator comparison runs on this same
    converted trace, so both sides see the same jobs. Times are divided by `compress` and shifted
    so the first job arrives at 0; a duration becomes max(1, round(duration * 1000 / step_ms))
    steps of `step_ms`, and the simulator gets exactly steps * step_ms. The state is the job's
    checkpoint_mb in KB, capped at `state_kb_cap` (a compressed replay cannot afford GB
    checkpoints); the simulator prices switches for the capped size. Deadlines are dropped on
    both sides. gpu_util is the job's avg_util, else 0.9, on both sides.
    """
    if not (math.isfinite(compress) and compress > 0):
        raise ValueError(f"compress must be a finite number > 0, not {compress!r}")
    if not (math.isfinite(step_ms) and 0 < step_ms <= MAX_STEP_MS):
        raise ValueError(f"step_ms must be above 0 and at most {MAX_STEP_MS:g}, not {step_ms!r}")
    if not (isinstance(state_kb_cap, int) and 0 <= state_kb_cap <= MAX_STATE_KB):
        raise ValueError(f"state_kb_cap must be a whole number from 0 to {MAX_STATE_KB}, not {state_kb_cap!r}")
    if not trace.jobs:
        raise ValueError("the trace has no jobs")
    origin = trace.jobs[0].submit_s
    jobs, bodies = [], []
    multi = capped = 0
    for job in trace.jobs:
        live_s = job.duration_s / compress
        steps = max(1, round(live_s * 1000.0 / step_ms))
        if steps > MAX_STEPS:
            raise ValueError(
                f"job {job.key!r} (line {job.line}) would need {steps:,} steps of {step_ms:g} ms, more than "
                f"the synthetic workload's {MAX_STEPS:,}: compress more, or use longer steps"
            )
        wanted_kb = round(job.checkpoint_mb * 1024)
        state_kb = min(wanted_kb, state_kb_cap)
        multi += job.num_gpu > 1
        capped += wanted_kb > state_kb_cap
        gpu_util = DEFAULT_GPU_UTIL if job.avg_util is None else min(max(job.avg_util, 0.0), 1.0)
        jobs.append(
            replace(
                job,
                submit_s=(job.submit_s - origin) / compress,
                duration_s=steps * step_ms / 1000.0,
                num_gpu=1,
                deadline_s=None,
                checkpoint_mb=state_kb / 1024,
                avg_util=gpu_util,
            )
        )
        bodies.append(
            {
                "name": f"{name_prefix}:{job.key}"[:NAME_MAX],
                "tier": job.tier,
                "workload": "synthetic",
                "params": {"steps": steps, "step_ms": step_ms, "state_kb": state_kb, "gpu_util": gpu_util},
            }
        )
    mapping = [
        *trace.mapping,
        "live mode: every job runs on one GPU (the live system runs single-GPU jobs only); "
        f"{multi} multi-GPU job(s) ran as single-GPU jobs with the same duration, in the simulator too",
        f"live mode: arrivals and durations / {compress:g}, the first arrival at 0; "
        f"durations in whole steps of {step_ms:g} ms",
        f"live mode: state = checkpoint_mb in KB, capped at {state_kb_cap} KB ({capped} job(s) capped); "
        "switches cost what the capped state costs, on both sides",
        "live mode: no deadlines on either side; tier start timeouts still apply",
        "live mode: the simulator's turns last one live slice (quantum below any slice)",
    ]
    converted = replace(trace, jobs=jobs, mapping=mapping)
    return LivePlan(converted, bodies, compress, step_ms, state_kb_cap, multi, capped)


def simulate(plan: LivePlan, config: Config) -> RunResult:
    """clockq's policy replayed over the converted trace, with turns of one live slice."""
    return replay(plan.trace, "clockq", replace(config, quantum_s=LIVE_QUANTUM_S, progress=None))


# --- the API -----------------------------------------------------------------------------------


def token_from_env(environ: Mapping[str, str] = os.environ) -> str:
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise LiveError(
            f"live mode needs an API token in the environment variable {TOKEN_ENV} "
            "(make one with `python manage.py createtoken USER`, or on the API tokens page)"
        )
    return token


class Client:
    """clockq's JSON API with a knox token. (Not basic auth: it hashes a password per request.)"""

    def __init__(self, url: str, token: str, *, timeout_s: float = 15.0, session: requests.Session | None = None):
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise LiveError(f"the live URL must start with http:// or https://, not {url[:60]!r}")
        if not token:
            raise LiveError("no API token")
        self.url = url
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.session.headers.update({"Authorization": f"Token {token}", "Accept": "application/json"})

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.session.request(method, self.url + path, timeout=self.timeout_s, **kwargs)
        except requests.ConnectionError as exc:
            raise LiveError(f"{method} {self.url}{path}: cannot connect (is clockq running there?)") from exc
        except requests.RequestException as exc:
            raise LiveError(f"{method} {self.url}{path}: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if r.status_code == 401:
            raise LiveError(f"{method} {self.url}{path}: 401, the token was refused (wrong or expired?)")
        if not 200 <= r.status_code < 300:
            raise LiveError(f"{method} {self.url}{path}: {r.status_code} {r.text[:300]}")
        try:
            return r.json()
        except ValueError as exc:
            raise LiveError(f"{method} {self.url}{path}: the answer is not JSON: {r.text[:200]!r}") from exc

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/jobs", json=body)

    def job(self, job_id: int, *, history: bool = False) -> dict[str, Any]:
        return self.request("GET", f"/api/jobs/{job_id}" + ("?history=1" if history else ""))

    def cancel(self, job_id: int) -> None:
        self.request("POST", f"/api/jobs/{job_id}/cancel")

    def queues(self) -> dict[str, Any]:
        return self.request("GET", "/api/queues")

    def kpis(self, since: datetime, until: datetime) -> dict[str, Any]:
        return self.request("GET", "/api/kpis", params={"since": since.isoformat(), "until": until.isoformat()})


def check_cluster(client: Client, gpus: int) -> list[str]:
    """Refuse a cluster with another number of live GPU workers than the simulator's; warn when
    jobs already wait or run there (they take GPUs the simulator does not know of)."""
    answer = client.queues()
    workers = answer.get("workers")
    if workers is None:
        raise LiveError(f"{client.url}/api/queues cannot list the workers (is its broker down?)")
    live_gpus = sum(1 for w in workers if w.get("gpu") is not None)
    if live_gpus != gpus:
        raise LiveError(
            f"the live cluster has {live_gpus} GPU worker(s) and the simulator {gpus}: "
            f"run with --gpus {live_gpus}, or start the cluster with {gpus} (CLOCKQ_GPUS=sim:{gpus})"
        )
    busy = {t["tier"]: t["waiting"] + t["running"] + t["held"] for t in answer.get("tiers", [])}
    busy = {tier: n for tier, n in busy.items() if n}
    if busy:
        return [f"the cluster was not idle at the start (waiting, running or held: {busy}): other work shares the GPUs"]
    return []


# --- submission and read-back ------------------------------------------------------------------


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
        done.append(Submitted(job.key, int(answer["id"]), job.submit_s, sent, _when(answer["submitted_at"])))
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
        (_when(e["at"]) for e in events if e["from_state"] == "queued" and e["to_state"] == "running"), None
    )
    if first_start is None and answer.get("first_started_at"):
        first_start = _when(answer["first_started_at"])
    complete = len(slices) == answer.get("slices", len(slices)) and len(slices) < HISTORY_CAP
    if complete:
        busy = sum(x["used_ms"] for x in slices) / 1000.0
        held: float | None = sum((_when(x["ended_at"]) - _when(x["started_at"])).total_seconds() for x in slices)
    else:
        busy, held = answer.get("run_ms", 0) / 1000.0, None
    return LiveJob(
        key=s.key,
        id=s.id,
        tier=answer.get("original_tier") or answer.get("tier", ""),
        state=answer["state"],
        planned_s=s.planned_s,
        submitted_at=_when(answer.get("submitted_at")) or s.submitted_at,
        first_start=first_start,
        finished_at=_when(answer.get("finished_at")),
        busy_s=busy,
        held_s=held,
        yields=sum(1 for e in events if e["from_state"] == "running" and e["to_state"] == "queued"),
        promotions=sum(
            1
            for e in events
            if e["from_state"] == e["to_state"] == "queued"
            and str(e.get("reason", "")).startswith(("promoted", "batch chance"))
        ),
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
        rolled = _when(answer.get("rolled_up_until"))
        if (rolled is not None and rolled >= end) or clock() >= deadline:
            answer["covered"] = rolled is not None and rolled >= end
            return answer
        sleep(min(5.0, max(deadline - clock(), 0.0)))


# --- the comparison ----------------------------------------------------------------------------


def kendall(order_a: Sequence[str], order_b: Sequence[str]) -> dict[str, Any]:
    """How two start orders agree, over the jobs that appear in both: the pairs in a different
    order (discordant), and Kendall's tau = (concordant - discordant) / pairs (None: < 2 jobs)."""
    pos_b = {k: i for i, k in enumerate(order_b)}
    common = [k for k in order_a if k in pos_b]
    n = len(common)
    discordant = sum(1 for i in range(n) for j in range(i + 1, n) if pos_b[common[i]] > pos_b[common[j]])
    pairs = n * (n - 1) // 2
    return {
        "jobs": n,
        "pairs": pairs,
        "discordant": discordant,
        "kendall_tau": None if pairs == 0 else (pairs - 2 * discordant) / pairs,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def compare(
    plan: LivePlan,
    sim: RunResult,
    live: Sequence[LiveJob],
    *,
    gpus: int,
    kpis: dict[str, Any] | None = None,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """Simulator against live, as a JSON-ready dict (render() prints it). Live times are in
    seconds from the first job's planned submission, by the server's clock: origin = the
    earliest submitted_at - planned submit time (the job sent with the least lag)."""
    by_key = {j.key: j for j in live}
    if not live:
        raise ValueError("no live jobs to compare")
    origin = min(j.submitted_at - timedelta(seconds=j.planned_s) for j in live)

    def secs(t: datetime) -> float:
        return (t - origin).total_seconds()

    def rel(t: datetime | None) -> float | None:
        return None if t is None else secs(t)

    sim_by_key = {r.job.key: r for r in sim.jobs}
    live_order = [key for _, key in sorted((j.first_start, j.key) for j in live if j.first_start is not None)]
    sim_pos = {k: i + 1 for i, k in enumerate(sim.start_order)}
    live_pos = {k: i + 1 for i, k in enumerate(live_order)}

    per_job: list[dict[str, Any]] = []
    for tj in plan.trace.jobs:
        r, lj = sim_by_key[tj.key], by_key.get(tj.key)
        live_start = rel(lj.first_start) if lj else None
        live_submit = rel(lj.submitted_at) if lj else None
        per_job.append(
            {
                "key": tj.key,
                "id": lj.id if lj else None,
                "tier": tj.tier,
                "submit_s": tj.submit_s,
                "live_submit_s": live_submit,
                "sim_start_s": r.first_start_s,
                "live_start_s": live_start,
                "sim_wait_s": r.wait_s,
                "live_wait_s": lj.wait_s if lj else None,
                "sim_pos": sim_pos.get(tj.key),
                "live_pos": live_pos.get(tj.key),
                "sim_finish_s": r.finish_s,
                "live_finish_s": rel(lj.finished_at) if lj else None,
                "sim_state": "timed_out" if r.timed_out else "succeeded" if r.succeeded else "unfinished",
                "live_state": lj.state if lj else "not submitted",
                "sim_preemptions": r.preemptions,
                "live_yields": lj.yields if lj else None,
                "sim_promotions": r.promotions,
                "live_promotions": lj.promotions if lj else None,
            }
        )

    sim_waits = [w for w in (r.wait_s for r in sim.jobs) if w is not None]
    live_waits = [row["live_wait_s"] for row in per_job if row["live_wait_s"] is not None]
    sim_mean, live_mean = _mean(sim_waits), _mean(live_waits)

    sim_first = min(tj.submit_s for tj in plan.trace.jobs)
    sim_last = max((r.finish_s for r in sim.jobs if r.finish_s is not None), default=sim_first)
    sim_span = sim_last - sim_first
    live_first = min(secs(j.submitted_at) for j in live)
    live_last = max((secs(j.finished_at) for j in live if j.finished_at), default=live_first)
    live_span = live_last - live_first
    helds = [j.held_s for j in live]
    live_held = None if any(h is None for h in helds) else sum(h for h in helds if h is not None)

    order = kendall(sim.start_order, live_order)
    order["same"] = sim.start_order == live_order
    order["sim"] = list(sim.start_order)
    order["live"] = live_order
    order["not_started"] = {
        "sim": [r.job.key for r in sim.jobs if r.first_start_s is None],
        "live": [row["key"] for row in per_job if row["live_start_s"] is None],
    }
    submit_lags = [row["live_submit_s"] - row["submit_s"] for row in per_job if row["live_submit_s"] is not None]

    return {
        "trace": plan.trace.name,
        "jobs": len(plan.trace.jobs),
        "gpus": gpus,
        "compress": plan.compress,
        "step_ms": plan.step_ms,
        "state_kb_cap": plan.state_kb_cap,
        "multi_gpu_jobs": plan.multi_gpu_jobs,
        "capped_state_jobs": plan.capped_state_jobs,
        "start_order": order,
        "wait_mean_s": {
            "sim": sim_mean,
            "live": live_mean,
            "diff": None if sim_mean is None or live_mean is None else live_mean - sim_mean,
            "sim_started": len(sim_waits),
            "live_started": len(live_waits),
        },
        "utilisation": {
            "sim": {
                "busy": _ratio(sim.busy_gpu_s, gpus * sim_span),
                "held": _ratio(sim.busy_gpu_s + sim.switch_gpu_s, gpus * sim_span),
                "span_s": sim_span,
            },
            "live": {
                "busy": _ratio(sum(j.busy_s for j in live), gpus * live_span),
                "held": None if live_held is None else _ratio(live_held, gpus * live_span),
                "span_s": live_span,
            },
        },
        "states": {
            "sim": dict(Counter(row["sim_state"] for row in per_job)),
            "live": dict(Counter(row["live_state"] for row in per_job)),
        },
        "switches": {
            "sim_preemptions": sum(r.preemptions for r in sim.jobs),
            "live_yields": sum(j.yields for j in live),
            "sim_promotions": sum(r.promotions for r in sim.jobs),
            "live_promotions": sum(j.promotions for j in live),
        },
        "submit_lag_s": {"mean": _mean(submit_lags), "max": max(submit_lags, default=None)},
        "live_window": {"since": _iso(origin), "until": _iso(origin + timedelta(seconds=live_last))},
        "kpis": _kpi_digest(kpis, {tj.tier for tj in plan.trace.jobs}),
        "per_job": per_job,
        "warnings": list(warnings),
        "mapping": list(plan.trace.mapping),
    }


def _kpi_digest(kpis: dict[str, Any] | None, tiers: set[str]) -> dict[str, Any] | None:
    """What /api/kpis says about waits (and GPU busy share), for the tiers in the trace."""
    if kpis is None:
        return None
    if "error" in kpis:
        return {"error": kpis["error"]}

    def waits(t: dict[str, Any]) -> dict[str, Any]:
        return {k: t.get(k) for k in ("started", "wait_mean_s", "wait_p95_s", "late")}

    return {
        "since": kpis.get("since"),
        "until": kpis.get("until"),
        "rolled_up_until": kpis.get("rolled_up_until"),
        "covered": kpis.get("covered", False),
        "overall": waits(kpis.get("overall") or {}),
        "tiers": {code: waits(t) for code, t in (kpis.get("tiers") or {}).items() if code in tiers},
        "gpu_busy_share": (kpis.get("gpus") or {}).get("busy_share"),
    }


# --- the whole run -----------------------------------------------------------------------------


def run_live(
    trace: Trace,
    *,
    url: str,
    token: str,
    config: Config,
    compress: float = 1.0,
    step_ms: float = DEFAULT_STEP_MS,
    state_kb_cap: int = DEFAULT_STATE_KB_CAP,
    timeout_s: float | None = None,
    poll_s: float = 0.5,
    kpi_wait_s: float = 0.0,
    progress: Progress | None = None,
    client: Client | None = None,
) -> dict[str, Any]:
    """Convert, simulate, submit, wait, read back, compare (see the module's docstring).

    The simulator runs first: its makespan bounds the wait, by default 60 s + twice its last
    finish. If the run is cut short (timeout, an error, Ctrl-C), the jobs it submitted that have
    not ended are cancelled, and the error says so."""
    plan = convert(trace, compress=compress, step_ms=step_ms, state_kb_cap=state_kb_cap)
    sim = simulate(plan, config)
    sim_end = max((r.finish_s or 0.0 for r in sim.jobs), default=0.0)
    if timeout_s is None:
        timeout_s = 60.0 + 2.0 * sim_end
    client = client or Client(url, token)
    warnings = check_cluster(client, config.gpus)
    if progress:
        progress(
            f"live: {len(plan.bodies)} jobs to {client.url} on {config.gpus} GPU(s); the simulator expects "
            f"the last to end at {sim_end:.1f} s (giving up after {timeout_s:.0f} s)"
        )
    submitted: list[Submitted] = []
    t0 = time.monotonic()
    try:
        submit_all(client, plan, progress=progress, submitted=submitted)
        answers = wait_for_all(client, submitted, timeout_s=timeout_s, since=t0, poll_s=poll_s, progress=progress)
    except BaseException as exc:
        cancelled = _cancel_unfinished(client, submitted)
        if isinstance(exc, LiveError) and cancelled:
            raise LiveError(f"{exc}; cancelled the {len(cancelled)} unfinished job(s) it had submitted") from exc
        raise
    live = [live_job(s, answers[s.id]) for s in submitted]
    ends = [j.finished_at for j in live if j.finished_at]
    since = min(j.submitted_at for j in live)
    until = max(ends) if ends else datetime.now(UTC)
    if progress and kpi_wait_s > 0:
        progress(f"waiting up to {kpi_wait_s:.0f} s for the KPI rollup to cover the run")
    kpis = fetch_kpis(client, since, until + timedelta(seconds=1), wait_s=kpi_wait_s)
    return compare(plan, sim, live, gpus=config.gpus, kpis=kpis, warnings=warnings)


def _cancel_unfinished(client: Client, submitted: Sequence[Submitted]) -> list[int]:
    cancelled = []
    for s in submitted:
        try:
            if client.job(s.id)["state"] not in TERMINAL:
                client.cancel(s.id)
                cancelled.append(s.id)
        except (LiveError, KeyError):
            continue  # best effort: it may have ended meanwhile (409), or the server is gone
    return cancelled


# --- text --------------------------------------------------------------------------------------


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(c: dict[str, Any]) -> str:
    """The comparison as text for a terminal."""
    o, w, u = c["start_order"], c["wait_mean_s"], c["utilisation"]
    lines = [
        f"live vs simulator (clockq policy): {c['trace']}, {c['jobs']} jobs on {c['gpus']} GPU(s), "
        f"compressed x{c['compress']:g}, {c['step_ms']:g} ms steps, state capped at {c['state_kb_cap']} KB",
        f"  {c['multi_gpu_jobs']} multi-GPU job(s) ran as single-GPU jobs with the same duration, on both sides; "
        f"{c['capped_state_jobs']} job(s) had their state capped",
    ]
    lines += [f"  warning: {x}" for x in c["warnings"]]
    tau = "-" if o["kendall_tau"] is None else f"{o['kendall_tau']:.3f}"
    verdict = "the same" if o["same"] else f"{o['discordant']} of {o['pairs']} pairs in a different order"
    lines += [
        "",
        f"start order: {verdict} (Kendall tau {tau}, over {o['jobs']} jobs started on both sides)",
        f"  sim : {' '.join(o['sim'])}",
        f"  live: {' '.join(o['live'])}",
    ]
    for side in ("sim", "live"):
        if o["not_started"][side]:
            lines.append(f"  never started ({side}): {' '.join(o['not_started'][side])}")
    diff = "" if w["diff"] is None else f" ({w['diff']:+.2f} s)"
    lines += [
        f"mean wait:   sim {_s(w['sim'])} s over {w['sim_started']}, "
        f"live {_s(w['live'])} s over {w['live_started']}{diff}",
        f"utilisation: sim {_pct(u['sim']['busy'])} computing, {_pct(u['sim']['held'])} held, "
        f"over {_s(u['sim']['span_s'], 1)} s; live {_pct(u['live']['busy'])} computing, "
        f"{_pct(u['live']['held'])} held, over {_s(u['live']['span_s'], 1)} s",
        f"ended:       sim {c['states']['sim']}, live {c['states']['live']}",
        f"switches:    sim {c['switches']['sim_preemptions']} yields (turns and RT preemptions) and "
        f"{c['switches']['sim_promotions']} promotions; live {c['switches']['live_yields']} yields and "
        f"{c['switches']['live_promotions']} promotions",
        f"submission:  {_s(c['submit_lag_s']['mean'], 3)} s late on average, at most "
        f"{_s(c['submit_lag_s']['max'], 3)} s",
    ]
    k = c.get("kpis")
    if k and "error" in k:
        lines.append(f"/api/kpis: {k['error']}")
    elif k:
        ov = k["overall"]
        cover = "covers the run" if k["covered"] else "does NOT cover the whole run yet (rollup every 60 s)"
        lines.append(
            f"/api/kpis {k['since']} .. {k['until']} (rolled up until {k['rolled_up_until']}: {cover}; "
            f"every job in those minutes counts): started {ov['started']}, wait mean {_s(ov['wait_mean_s'])} s, "
            f"p95 {_s(ov['wait_p95_s'])} s, GPU busy share {_pct(k['gpu_busy_share'])}"
        )
        for code, t in k["tiers"].items():
            if t["started"]:
                waits = f"wait mean {_s(t['wait_mean_s'])} s, p95 {_s(t['wait_p95_s'])} s"
                lines.append(f"  {code}: started {t['started']}, {waits}")
    header = ("job", "tier", "submit", "live sub", "sim start", "live start", "sim wait", "live wait", "pos s/l",
              "sim end", "live end", "live state")  # fmt: skip
    rows = [
        (
            r["key"],
            r["tier"],
            _s(r["submit_s"]),
            _s(r["live_submit_s"]),
            _s(r["sim_start_s"]),
            _s(r["live_start_s"]),
            _s(r["sim_wait_s"]),
            _s(r["live_wait_s"]),
            f"{r['sim_pos'] or '-'}/{r['live_pos'] or '-'}",
            _s(r["sim_finish_s"]),
            _s(r["live_finish_s"]),
            r["live_state"],
        )
        for r in c["per_job"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines += ["", "per job (seconds from the first submission; live: the server's clock):"]
    for row in (header, *rows):  # key and tier to the left, numbers to the right
        cells = (
            str(x).ljust(n) if i < 2 else str(x).rjust(n) for i, (x, n) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("  " + "  ".join(cells))
    lines += ["", "mapping:", *(f"  {m}" for m in c["mapping"])]
    return "\n".join(lines) + "\n"


# --- small helpers -----------------------------------------------------------------------------


def _state(answer: dict[str, Any]) -> str:
    return f"{answer['state']}, progress {answer.get('progress', 0.0):.0%}"


def _when(raw: str | None) -> Any:
    """An API timestamp (ISO 8601) as an aware datetime; None stays None."""
    if raw is None or raw == "":
        return None
    when = datetime.fromisoformat(raw)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


def _ceil_minute(when: datetime) -> datetime:
    floor = when.replace(second=0, microsecond=0)
    return floor if floor == when else floor + timedelta(minutes=1)


__all__ = [
    "DEFAULT_STATE_KB_CAP",
    "DEFAULT_STEP_MS",
    "Client",
    "LiveError",
    "LiveJob",
    "LivePlan",
    "compare",
    "convert",
    "kendall",
    "render",
    "run_live",
    "simulate",
    "token_from_env",
]
