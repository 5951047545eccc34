"""The live replay (bench/live_replay, run by bench/replay_live.py): the simulator against reality.

The end-to-end test runs a small fixed trace on real workers: a private redis-server, two GPU
worker processes with simulated GPUs (`manage.py gpuworkers`), and the web API on a real HTTP
port (pytest-django's live server), reached with a knox token as bench/replay_live.py reaches it.
Beat is not started: the trace's longest wait (about 4 s) is far from the three skipped 10 s
rounds that promote an SP job, so neither side promotes, and deadlines are dropped in live mode.

The trace (tests/replay/fixtures/live_small.csv, 2 GPUs, one job per tier and a second HP job;
the times are the simulator's, live ones run some 15-20 % later, see MEAN_WAIT_TOLERANCE_S):

    a-sp   0.0 s  6 s  runs at once
    b-hp   1.5 s  6 s  runs at once (asks for 2 GPUs: runs on 1, on both sides)
    c-bk   3.0 s  4 s  waits: both GPUs hold more urgent work
    d-bp   4.5 s  6 s  waits; takes the first GPU that frees (a's, 6.0 s): BP goes before BK
    c-bk               takes the second (b's, 7.5 s): after d, though it came first
    e-rt  10.5 s  1 s  cuts short c or d (both sides take the cheaper switch, as measured
                       on each side; no later first start depends on which)
    f-hp  12.0 s  2 s  starts at once, or cuts short a running BK/BP job (HP interrupts)

Arrivals are 1.5 s apart or more, and no first start hangs on a race: the simulator keeps this
order with every job up to 40 % longer and submitted up to 0.3 s late, under 300 seeds of the RT
victim draw (live, jobs ran 15-20 % longer here).
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench import live_replay as live
from clockq.jobs import workloads
from clockq.policy.ordering import BASE_LADDER_GPU_S, DEFAULT_LADDER, Ladder
from clockq.replay import traces
from clockq.replay.config import Config
from clockq.replay.model import JobResult, RunResult, Trace, TraceJob

FIXTURE = Path(__file__).resolve().parent.parent / "replay" / "fixtures" / "live_small.csv"
# Live waits run longer than simulated ones, for two reasons. Each first start pays the broker
# hop and the claim (0.05-0.15 s here). And live jobs run longer than steps x step_ms: a job
# running alone continues slice after slice, and every boundary (about 60 ms apart) costs some
# 9 ms (a job write, a Slice row, the GPU sampler): 15-20 % here, so a job that waits for a GPU
# waits out that much more of the job before it. Two jobs wait so: c behind b and d behind a,
# each 6 s of work; at 15-20 % that moves the mean wait by (2 x 6 x 0.2 + 6 x 0.1) / 6 = 0.5 s.
# 1.0 s allows an overrun of up to 40 % (a loaded machine), beyond which the start order itself
# would be at risk; the order check, not this one, catches a job started out of turn.
MEAN_WAIT_TOLERANCE_S = 1.0


def job(key: str, submit_s: float, duration_s: float, tier: str = "SP", **kw) -> TraceJob:
    fields = {"line": 2, "num_gpu": 1, "deadline_s": None, "checkpoint_mb": 1.0, **kw}
    return TraceJob(key=key, submit_s=submit_s, duration_s=duration_s, tier=tier, **fields)


def small_trace(*jobs: TraceJob) -> Trace:
    return Trace(name="t.csv", jobs=list(jobs), mapping=["as given"])


# --- the conversion ----------------------------------------------------------------------------


def test_convert_gives_every_job_one_gpu_and_whole_steps_and_the_simulator_the_same_jobs():
    trace = small_trace(
        job("gang", 100.0, 50.0, "HP", num_gpu=8, deadline_s=400.0, checkpoint_mb=1149.6),
        job("tiny", 110.0, 0.001, "BK", checkpoint_mb=0.5, avg_util=0.4),
    )
    plan = live.convert(trace, compress=10, step_ms=20, state_kb_cap=1024)

    gang, tiny = plan.trace.jobs
    assert (gang.num_gpu, gang.submit_s, gang.duration_s, gang.deadline_s) == (1, 0.0, 5.0, None)
    assert tiny.submit_s == pytest.approx(1.0) and tiny.duration_s == pytest.approx(0.02)  # at least one step
    assert gang.checkpoint_mb == 1.0 and tiny.checkpoint_mb == 0.5  # the capped state, priced as such
    assert (gang.avg_util, tiny.avg_util) == (0.9, 0.4)
    assert plan.multi_gpu_jobs == 1 and plan.capped_state_jobs == 1
    assert plan.bodies[0] == {
        "name": "replay:gang",
        "tier": "HP",
        "workload": "synthetic",
        "params": {"steps": 250, "step_ms": 20, "state_kb": 1024, "gpu_util": 0.9},
    }
    assert plan.bodies[1]["params"]["steps"] == 1 and plan.bodies[1]["params"]["state_kb"] == 512
    assert any("multi-GPU job(s) ran as single-GPU jobs" in line for line in plan.trace.mapping)
    for body in plan.bodies:  # what the API will accept: the workload's own limits
        assert (
            workloads.validate("synthetic", body["params"], may_run_commands=False)["steps"] == body["params"]["steps"]
        )
    assert trace.jobs[0].num_gpu == 8  # the original is left alone


def test_convert_compresses_the_ladder_with_the_run_times_and_gives_every_job_one_user():
    # Given a job that passes the first rung of BK's ladder in the trace (300 GPU-s), and one short of it
    trace = small_trace(job("long", 0.0, 400.0, "BK", user="ann"), job("short", 1.0, 200.0, "BK", user="bo"))
    # When it is compressed 100 times, on a ladder of the trace's
    plan = live.convert(trace, compress=100, ladder=Ladder(base_gpu_s=(300.0, 2400.0)))
    # Then both sides run the ladder / 100: the long job still passes the first rung, the short one not
    assert plan.ladder.base_gpu_s == (3.0, 24.0)
    assert plan.past_first_rung() == 1
    assert any("ladder / 100: 3,24 GPU-seconds" in line for line in plan.trace.mapping)
    # And every job is the one user's who submits them live (the simulator's fair share sees one)
    assert {j.user for j in plan.trace.jobs} == {""}
    # And the simulator runs that ladder, whatever the config's: on one GPU the long job makes way
    # for the short one at 3 s of service (on the default ladder it would at 300)
    sim = {r.job.key: r for r in live.simulate(plan, Config(gpus=1)).jobs}
    assert sim["long"].preemptions == 1 and sim["short"].first_start_s == pytest.approx(3.0, abs=0.05)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compress": 0}, "compress"),
        ({"compress": float("nan")}, "compress"),
        ({"step_ms": 0}, "step_ms"),
        ({"state_kb_cap": 2_000_000}, "state_kb_cap"),
        ({"compress": 1e-6}, "steps"),  # 50 s x 10^6 in 20 ms steps: beyond the workload's limit
    ],
)
def test_convert_refuses_what_the_live_system_cannot_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        live.convert(small_trace(job("j", 0.0, 50.0)), **kwargs)


# --- the comparison ----------------------------------------------------------------------------


def test_kendall_counts_the_pairs_in_a_different_order():
    assert live.kendall(list("abcd"), list("abcd")) == {"jobs": 4, "pairs": 6, "discordant": 0, "kendall_tau": 1.0}
    assert live.kendall(list("abcd"), list("dcba"))["kendall_tau"] == -1.0
    one_swap = live.kendall(list("abcd"), list("abdc"))
    assert one_swap["discordant"] == 1 and one_swap["kendall_tau"] == pytest.approx(4 / 6)
    assert live.kendall(list("abc"), list("cz"))["kendall_tau"] is None  # one job in common: no pair


def test_compare_puts_sim_and_live_side_by_side():
    plan = live.convert(small_trace(job("a", 0.0, 4.0, "HP"), job("b", 1.0, 2.0, "BK"), job("c", 2.0, 2.0, "HP")))
    a, b, c = plan.trace.jobs
    sim = RunResult(
        policy="clockq",
        gpus=1,
        jobs=[JobResult(a, 0.0, 4.0), JobResult(b, 6.0, 8.0), JobResult(c, 4.0, 6.0)],
        busy_gpu_s=8.0,
        switch_gpu_s=0.0,
        start_order=["a", "c", "b"],
        events=0,
    )
    t0 = datetime(2030, 1, 1, tzinfo=UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    def live_job(key, planned, submitted, start, end, busy):
        return live.LiveJob(
            key, ord(key), "HP", "succeeded", planned, at(submitted), at(start), at(end), busy, busy, 0, 0
        )

    # Live, b got the GPU before c: one pair differs. The first job went 0.1 s late, the others
    # on time: the origin follows the one with the least lag.
    jobs = [
        live_job("a", 0.0, 0.1, 0.2, 4.3, 4.0),
        live_job("b", 1.0, 1.0, 4.3, 6.4, 2.0),
        live_job("c", 2.0, 2.0, 6.4, 8.5, 2.0),
    ]
    kpis = {"rolled_up_until": None, "overall": {"started": 3, "wait_mean_s": 2.6}, "tiers": {"HP": {}, "RT": {}}}
    c_ = live.compare(plan, sim, jobs, gpus=1, kpis=kpis, warnings=["busy"])

    order = c_["start_order"]
    assert order["sim"] == ["a", "c", "b"] and order["live"] == ["a", "b", "c"]
    assert not order["same"] and order["discordant"] == 1
    rows = {r["key"]: r for r in c_["per_job"]}
    assert (rows["b"]["sim_pos"], rows["b"]["live_pos"]) == (3, 2)
    assert rows["a"]["live_submit_s"] == pytest.approx(0.1) and rows["a"]["live_start_s"] == pytest.approx(0.2)
    assert rows["b"]["live_wait_s"] == pytest.approx(3.3) and rows["b"]["sim_wait_s"] == pytest.approx(5.0)
    assert c_["wait_mean_s"]["sim"] == pytest.approx((0 + 5 + 2) / 3)
    assert c_["wait_mean_s"]["live"] == pytest.approx((0.1 + 3.3 + 4.4) / 3)
    assert c_["utilisation"]["sim"]["busy"] == pytest.approx(1.0)  # 8 GPU-s over 8 s on one GPU
    # Live: from the first submission as it happened (0.1 s) to the last end.
    assert c_["utilisation"]["live"]["busy"] == pytest.approx(8.0 / 8.4)
    assert c_["submit_lag_s"]["max"] == pytest.approx(0.1)
    assert c_["kpis"]["overall"]["wait_mean_s"] == 2.6 and set(c_["kpis"]["tiers"]) == {"HP"}
    text = live.render(c_)
    assert "1 of 3 pairs in a different order" in text and "warning: busy" in text


def test_live_job_reads_the_first_start_and_the_busy_time_from_the_history():
    answer = {
        "state": "succeeded",
        "original_tier": "SP",
        "submitted_at": "2030-01-01T00:00:00.000000Z",
        "first_started_at": "2030-01-01T00:00:01.000000Z",
        "finished_at": "2030-01-01T00:00:05.000000Z",
        "slices": 2,
        "run_ms": 999,
        "events": [
            {"at": "2030-01-01T00:00:01.000000Z", "from_state": "queued", "to_state": "running", "reason": "claimed"},
            {"at": "2030-01-01T00:00:02.000000Z", "from_state": "running", "to_state": "queued", "reason": "yield"},
            {
                "at": "2030-01-01T00:00:02.500000Z",
                "from_state": "queued",
                "to_state": "queued",
                "reason": "promoted SP",
            },
            {"at": "2030-01-01T00:00:03.000000Z", "from_state": "queued", "to_state": "running", "reason": "claimed"},
            {"at": "2030-01-01T00:00:05.000000Z", "from_state": "running", "to_state": "succeeded", "reason": "done"},
        ],
        "slice_history": [
            {"started_at": "2030-01-01T00:00:01Z", "ended_at": "2030-01-01T00:00:02Z", "used_ms": 950},
            {"started_at": "2030-01-01T00:00:03Z", "ended_at": "2030-01-01T00:00:05Z", "used_ms": 1900},
        ],
    }
    s = live.Submitted("k", 7, 0.0, 0.0, datetime(2030, 1, 1, tzinfo=UTC))
    j = live.live_job(s, answer)
    assert j.first_start == datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert (j.busy_s, j.held_s, j.yields, j.promotions, j.tier) == (2.85, 3.0, 1, 1, "SP")
    # A capped history (more slices than listed): run_ms, the same sum kept on the job.
    capped = live.live_job(s, {**answer, "slices": 900})
    assert capped.busy_s == 0.999 and capped.held_s is None


# --- the client, submission and read-back, against a fake API -----------------------------------


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeApi:
    """Answers like the API; every job stays in `state` until told otherwise."""

    url = "http://fake"

    def __init__(self, clock: FakeClock, state: str = "succeeded", workers: int = 2):
        self.clock, self.state, self.workers = clock, state, workers
        self.ladder: list[float] | None = list(BASE_LADDER_GPU_S)  # what each GPU worker announces
        self.sent: list[tuple[float, dict]] = []
        self.cancelled: list[int] = []

    def submit(self, body):
        self.sent.append((self.clock.now, body))
        self.clock.now += 0.01  # the POST takes 10 ms
        return {"id": len(self.sent), "submitted_at": "2030-01-01T00:00:00Z"}

    def job(self, job_id, history=False):
        return {"id": job_id, "state": self.state, "progress": 0.5}

    def cancel(self, job_id):
        self.cancelled.append(job_id)

    def queues(self):
        tiers = [{"tier": "SP", "waiting": 1, "running": 0, "held": 0}]
        gpus = [{"hostname": f"gpu{i}@h", "gpu": i, "service_ladder_s": self.ladder} for i in range(self.workers)]
        return {"tiers": tiers, "workers": [*gpus, {"hostname": "control@h", "gpu": None}]}


def test_submit_all_sends_each_job_at_its_time_by_the_monotonic_clock():
    clock = FakeClock()
    api = FakeApi(clock)
    plan = live.convert(small_trace(job("a", 10.0, 1.0), job("b", 12.0, 1.0), job("c", 12.0, 1.0)), compress=2)
    done = live.submit_all(api, plan, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert [t - 100.0 for t, _ in api.sent] == pytest.approx([0.0, 1.0, 1.01])  # c waits for b's POST
    assert [(s.key, s.id, s.planned_s) for s in done] == [("a", 1, 0.0), ("b", 2, 1.0), ("c", 3, 1.0)]
    assert done[2].sent_s == pytest.approx(1.01)


def test_waiting_past_the_timeout_names_every_unfinished_job():
    clock = FakeClock()
    api = FakeApi(clock, state="running")
    submitted = [live.Submitted(k, i, 0.0, 0.0, datetime(2030, 1, 1, tzinfo=UTC)) for i, k in enumerate("xy", 1)]
    with pytest.raises(
        live.LiveError, match=r"2 job\(s\) still unfinished after 5 s: x \(id 1, running, progress 50%\), y"
    ):
        live.wait_for_all(api, submitted, timeout_s=5, poll_s=1, clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]


def test_the_cluster_must_have_as_many_gpus_as_the_simulator():
    api = FakeApi(FakeClock(), workers=1)
    with pytest.raises(live.LiveError, match="1 GPU worker"):
        live.check_cluster(api, 2)  # type: ignore[arg-type]
    api.workers = 2
    assert "not idle" in live.check_cluster(api, 2)[0]  # type: ignore[arg-type]


def test_the_cluster_must_order_by_the_simulators_ladder():
    # Given a replay compressed 25 times: the simulator runs the default ladder / 25
    api = FakeApi(FakeClock())
    compressed = live.convert(small_trace(job("j", 0.0, 50.0)), compress=25).ladder
    expected = tuple(r / 25 for r in DEFAULT_LADDER.base_gpu_s)
    assert compressed.base_gpu_s == pytest.approx(expected)
    setting = ",".join(f"{r:g}" for r in expected)
    # When the workers run the default ladder, or announce none, the run is refused, saying what to set
    with pytest.raises(live.LiveError, match=f"CLOCKQ_SERVICE_LADDER_S={setting}") as refused:
        live.check_cluster(api, 2, compressed)  # type: ignore[arg-type]
    assert "gpu0@h" in str(refused.value) and "gpu1@h" in str(refused.value)
    api.ladder = None
    with pytest.raises(live.LiveError, match="not announced"):
        live.check_cluster(api, 2, compressed)  # type: ignore[arg-type]
    # Then a cluster started with the compressed ladder is taken
    api.ladder = list(expected)
    assert live.check_cluster(api, 2, compressed) == [  # type: ignore[arg-type]
        "the cluster was not idle at the start (waiting, running or held: {'SP': 1}): other work shares the GPUs"
    ]


def test_the_token_comes_from_the_environment_and_the_url_must_be_http():
    with pytest.raises(live.LiveError, match="CLOCKQ_API_TOKEN"):
        live.token_from_env({})
    assert live.token_from_env({"CLOCKQ_API_TOKEN": " abc \n"}) == "abc"
    with pytest.raises(live.LiveError, match="http"):
        live.Client("file:///etc/passwd", "abc")
    assert live.Client("http://h:8000/", "abc").session.headers["Authorization"] == "Token abc"


def test_the_script_refuses_a_run_without_a_token_before_it_submits_anything(monkeypatch):
    from bench import replay_live

    # A port bound but not listening: connecting to it is refused at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        args = [str(FIXTURE), "--format", "csv", "--gpus", "2", "--url", url, "--quiet"]
        monkeypatch.delenv("CLOCKQ_API_TOKEN", raising=False)
        with pytest.raises(SystemExit, match="CLOCKQ_API_TOKEN"):
            replay_live.main(args)
        monkeypatch.setenv("CLOCKQ_API_TOKEN", "abc")
        with pytest.raises(SystemExit, match="cannot connect"):
            replay_live.main(args)


# --- end to end, on real workers ---------------------------------------------------------------


@pytest.mark.slow  # a trace run end to end on a live server and workers; CI's slow pass runs it
@pytest.mark.integration
def test_live_mode_agrees_with_the_simulator_on_the_start_order_of_a_small_trace(
    alice, start_workers, live_server, settings
):
    from knox.models import AuthToken

    # The simulator's ladder (the default): the suite's short one would order live jobs by
    # service levels the simulator does not see.
    settings.CLOCKQ_SERVICE_LADDER_S = list(BASE_LADDER_GPU_S)
    start_workers(2)
    _instance, token = AuthToken.objects.create(user=alice)
    trace = traces.load(str(FIXTURE), "csv")
    lines: list[str] = []

    result = live.run_live(
        trace, url=live_server.url, token=token, config=Config(gpus=2), timeout_s=60, progress=lines.append
    )

    print(live.render(result))  # shown when the test fails
    assert result["states"]["live"] == {"succeeded": 6} and result["states"]["sim"] == {"succeeded": 6}
    order = result["start_order"]
    assert order["sim"] == ["a-sp", "b-hp", "d-bp", "c-bk", "e-rt", "f-hp"]
    assert order["live"] == order["sim"], "live start order differs from the simulator's"
    waits = result["wait_mean_s"]
    assert waits["live"] == pytest.approx(waits["sim"], abs=MEAN_WAIT_TOLERANCE_S)
    assert waits["live"] > 0  # every live first start pays the broker hop and the claim
    assert result["multi_gpu_jobs"] == 1
    # Utilisation differs by design (the live boundaries' cost above); only sane values here.
    live_use = result["utilisation"]["live"]
    assert 0 < live_use["busy"] <= live_use["held"] <= 1
    assert result["kpis"] is not None and "overall" in result["kpis"]  # fetched (no beat: nothing rolled up)
    assert any(line.startswith("submitted 6/6") for line in lines)
