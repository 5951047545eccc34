"""KPIs against the real database: a small fixture whose every KPI is worked out by hand below,
checked through summary(), series() and GET /api/kpis; the rollup's idempotency, its trailing
recompute, capacity from live workers, and retention.

The fixture (2026-12-01, times UTC, `10:01:30` means 10:01:30; GPU workers gpu0@h and gpu1@h
ran slices, gpu2@h is alive and idle):

  job  tier  submitted  first start (wait)     ended                    notes
  A    HP    10:00:00   10:00:30 (30 s)        succeeded 10:02:10       on time: wait <= 60 s target
  B    HP    10:00:00   10:03:00 (180 s)       succeeded 10:05:00       late at 10:01:00; not on time
  C    SP    10:00:00   10:01:00 (60 s)        timed_out 10:06:00       deadline 10:04:00
  D    SP    10:01:00   10:02:40 (100 s)       succeeded 10:07:50       deadline 10:09:00: on time
  E    RT    10:02:00   never                  timed_out 10:02:01       RT start timeout
  F    BK    10:00:00   10:04:00 (240 s)       failed 10:07:00
  G    SP    10:02:00   never                  cancelled 10:03:00
  H    SP    10:05:00   never, queued          -                        promoted to HP 10:06:00, back 10:06:30
  I    BP    10:00:00   never, queued          -                        batch chance 10:08:00

  slice  job  GPU   ran                    used   util  outcome    checkpoint + restore
  S1     A    gpu0  10:00:30 - 10:01:30    50 s   0.8   yielded    200 + 100 ms
  S2     A    gpu0  10:01:40 - 10:02:10    30 s   0.5   completed
  S3     C    gpu1  10:01:00 - 10:01:50    50 s   1.0   continued
  S4     C    gpu1  10:01:50 - 10:02:30     0 s   -     lost
  S5     D    gpu1  10:02:40 - 10:03:10    30 s   0.9   failed
  S6     D    gpu0  10:07:10 - 10:07:50    40 s   0.75  completed
  F1     F    gpu0  10:04:00 - 10:04:45    45 s   0.4   yielded    150 + 250 ms
  F2     F    gpu1  10:05:00 - 10:06:30    90 s   0.2   failed
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clockq.bus import heartbeat
from clockq.bus.client import client
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.kpis import reports as kpis
from clockq.kpis import rollup as kpi_rollup
from clockq.kpis.models import GpuMinute, KpiMinute
from tests.helpers import token_auth

pytestmark = pytest.mark.django_db

PRICE = 3.0
NOW = datetime(2026, 12, 1, 10, 10, 30, tzinfo=UTC)  # the rollup runs at 10:10:30
SINCE, UNTIL = datetime(2026, 12, 1, 10, 0, tzinfo=UTC), datetime(2026, 12, 1, 10, 10, tzinfo=UTC)


def t(clock: str) -> datetime:
    """'10:01:30' on the fixture's day, UTC."""
    h, m, s = (int(part) for part in clock.split(":"))
    return datetime(2026, 12, 1, h, m, s, tzinfo=UTC)


def make_job(owner, tier: str, submitted: str, *, state: str, started=None, wait_s=None, finished=None, **fields):
    tiers = {q.code: q for q in QueueTier.objects.all()}
    job = Job.objects.create(
        owner=owner,
        name=f"{tier}-{submitted}",
        tier=tiers[fields.pop("now_in", tier)],
        original_tier=tiers[tier],
        workload="synthetic",
        state=state,
        first_started_at=t(started) if started else None,
        first_wait_ms=None if wait_s is None else wait_s * 1000,
        finished_at=t(finished) if finished else None,
        **{k: t(v) for k, v in fields.items()},
    )
    Job.objects.filter(pk=job.pk).update(submitted_at=t(submitted))  # auto_now_add on create
    return job


def make_slice(job, gpu: int, ran: str, used_s: float, util, outcome: str, checkpoint_ms=0.0, restore_ms=0.0):
    start, end = ran.split(" - ")
    return Slice.objects.create(
        job=job,
        worker=f"gpu{gpu}@h",
        gpu_index=gpu,
        started_at=t(start),
        ended_at=t(end),
        planned_ms=60_000,
        used_ms=int(used_s * 1000),
        outcome=outcome,
        gpu_util=util,
        checkpoint_ms=checkpoint_ms,
        restore_ms=restore_ms,
    )


def make_event(job, at: str, reason: str):
    event = JobEvent.objects.create(job=job, from_state="queued", to_state="queued", reason=reason, actor="test")
    JobEvent.objects.filter(pk=event.pk).update(at=t(at))


def announce_gpus(*hostnames_and_gpus):
    for hostname, gpu in hostnames_and_gpus:
        heartbeat.announce(client(), {"hostname": hostname, "gpu": gpu})


@pytest.fixture
def fixture(alice, settings):
    settings.CLOCKQ_GPU_HOUR_PRICE = PRICE
    a = make_job(alice, "HP", "10:00:00", state="succeeded", started="10:00:30", wait_s=30, finished="10:02:10")
    make_job(
        alice,
        "HP",
        "10:00:00",
        state="succeeded",
        started="10:03:00",
        wait_s=180,
        finished="10:05:00",
        late_at="10:01:00",
    )
    c = make_job(
        alice,
        "SP",
        "10:00:00",
        state="timed_out",
        started="10:01:00",
        wait_s=60,
        finished="10:06:00",
        deadline="10:04:00",
    )
    d = make_job(
        alice,
        "SP",
        "10:01:00",
        state="succeeded",
        started="10:02:40",
        wait_s=100,
        finished="10:07:50",
        deadline="10:09:00",
    )
    make_job(alice, "RT", "10:02:00", state="timed_out", finished="10:02:01")
    f = make_job(alice, "BK", "10:00:00", state="failed", started="10:04:00", wait_s=240, finished="10:07:00")
    make_job(alice, "SP", "10:02:00", state="cancelled", finished="10:03:00")
    h = make_job(alice, "SP", "10:05:00", state="queued", now_in="HP")
    i = make_job(alice, "BP", "10:00:00", state="queued")
    make_event(h, "10:06:00", "promoted SP -> HP: skipped in 3 consecutive rounds")
    make_event(h, "10:06:30", "returned to SP after 0.1 s of service in HP")  # not a promotion
    make_event(i, "10:08:00", "batch chance: lifted to SP, the oldest waiting BP job")
    make_slice(a, 0, "10:00:30 - 10:01:30", 50, 0.8, "yielded", checkpoint_ms=200, restore_ms=100)
    make_slice(a, 0, "10:01:40 - 10:02:10", 30, 0.5, "completed")
    make_slice(c, 1, "10:01:00 - 10:01:50", 50, 1.0, "continued")
    make_slice(c, 1, "10:01:50 - 10:02:30", 0, None, "lost")
    make_slice(d, 1, "10:02:40 - 10:03:10", 30, 0.9, "failed")
    make_slice(d, 0, "10:07:10 - 10:07:50", 40, 0.75, "completed")
    make_slice(f, 0, "10:04:00 - 10:04:45", 45, 0.4, "yielded", checkpoint_ms=150, restore_ms=250)
    make_slice(f, 1, "10:05:00 - 10:06:30", 90, 0.2, "failed")
    announce_gpus(("gpu0@h", 0), ("gpu1@h", 1), ("gpu2@h", 2), ("control@h", None))
    kpis.rollup(NOW)


# --- the hand computation ------------------------------------------------------------------
# GPU time per slice and minute (a slice counts in the minutes it ran):
#   gpu0: 10:00 S1 30 s | 10:01 S1 30 + S2 20 s | 10:02 S2 10 s | 10:04 F1 45 s | 10:07 S6 40 s
#   gpu1: 10:01 S3 50 + S4 10 s | 10:02 S4 30 + S5 20 s | 10:03 S5 10 s | 10:05 F2 60 s | 10:06 F2 30 s
# Capacity: those 5 + 5 GPU-minutes, plus the 3 live GPU workers in 10:09, the minute completed
# when the rollup first ran (the control worker has no GPU): 13 GPU-minutes = 780 s.
CAPACITY_S = 13 * 60
# Busy: HP S1 60 + S2 30 = 90 s; SP S3 50 + S4 40 + S5 30 + S6 40 = 160 s; BK F1 45 + F2 90 = 135 s.
# Useful (completed, yielded, continued): HP 50 + 30 = 80 s; SP 50 + 40 = 90 s; BK 45 s.
# Utilisation x work time: HP 40 + 15 = 55 s; SP 50 + 27 + 30 = 107 s; BK 18 + 18 = 36 s.
BUSY_S = {"HP": 90, "SP": 160, "BK": 135}
ALL_BUSY_S = 90 + 160 + 135  # 385


def cost(tier_busy_s: float, useful_s: float) -> float:
    """price x the tier's part of the capacity (in proportion to its busy time) / useful hours."""
    return PRICE * (tier_busy_s / ALL_BUSY_S * CAPACITY_S / 3600) / (useful_s / 3600)


EXPECTED = {
    "HP": {
        "started": 2,
        "wait_mean_s": (30 + 180) / 2,
        # waits in buckets (10 s, 30 s] and (120 s, 300 s]; rank 0.95 x 2 = 1.9, the 0.9th of
        # the one wait in (120 s, 300 s]: 120 + 180 x 0.9
        "wait_p95_s": 282.0,
        "wait_target_s": 60.0,
        "ended": {"succeeded": 2, "failed": 0, "timed_out": 0, "cancelled": 0},
        "timeout_rate": 0.0,
        "on_time": 1,
        "on_time_rate": 0.5,  # A only: B waited past the 60 s target
        "late": 1,
        "promotions": 0,  # H's promotion counts for SP, its own tier
        "slices": 2,
        "slice_outcomes": {"completed": 1, "yielded": 1},
        "switches": 1,
        "switch_mean_ms": 300.0,
        "gpu_busy_share": 90 / 780,
        "gpu_util_mean": 55 / 780,
        "busy_gpu_hours": 90 / 3600,
        "useful_gpu_hours": 80 / 3600,
        "cost_per_useful_gpu_hour": cost(90, 80),
    },
    "SP": {
        "started": 2,
        "wait_mean_s": (60 + 100) / 2,
        # (30 s, 60 s] and (60 s, 120 s]: 60 + 60 x 0.9
        "wait_p95_s": 114.0,
        "wait_target_s": 600.0,
        "ended": {"succeeded": 1, "failed": 0, "timed_out": 1, "cancelled": 1},
        "timeout_rate": 1 / 2,  # C; the cancelled G counts in neither rate
        "on_time": 1,
        "on_time_rate": 1 / 2,  # D, by its deadline
        "late": 0,
        "promotions": 1,
        "slices": 4,
        "slice_outcomes": {"continued": 1, "lost": 1, "failed": 1, "completed": 1},
        "switches": 0,
        "switch_mean_ms": None,
        "gpu_busy_share": 160 / 780,
        "gpu_util_mean": 107 / 780,
        "busy_gpu_hours": 160 / 3600,
        "useful_gpu_hours": 90 / 3600,
        "cost_per_useful_gpu_hour": cost(160, 90),
    },
    "BK": {
        "started": 1,
        "wait_mean_s": 240.0,
        "wait_p95_s": 120 + 180 * 0.95,  # 291
        "wait_target_s": None,
        "ended": {"succeeded": 0, "failed": 1, "timed_out": 0, "cancelled": 0},
        "timeout_rate": 0.0,
        "on_time": 0,
        "on_time_rate": 0.0,
        "late": 0,
        "promotions": 0,
        "slices": 2,
        "slice_outcomes": {"failed": 1, "yielded": 1},
        "switches": 1,
        "switch_mean_ms": 400.0,
        "gpu_busy_share": 135 / 780,
        "gpu_util_mean": 36 / 780,
        "busy_gpu_hours": 135 / 3600,
        "useful_gpu_hours": 45 / 3600,
        "cost_per_useful_gpu_hour": cost(135, 45),
    },
    "RT": {
        "started": 0,
        "wait_mean_s": None,
        "wait_p95_s": None,
        "ended": {"succeeded": 0, "failed": 0, "timed_out": 1, "cancelled": 0},
        "timeout_rate": 1.0,
        "on_time_rate": 0.0,
        "gpu_busy_share": 0.0,
        "cost_per_useful_gpu_hour": None,  # no useful work to divide by
    },
    "BP": {"started": 0, "promotions": 1, "timeout_rate": None, "on_time_rate": None},
    "overall": {
        "started": 5,
        "wait_mean_s": (30 + 180 + 60 + 100 + 240) / 5,  # 122
        # buckets: (10, 30], (30, 60], (60, 120] one each, (120, 300] two; rank 4.75 is the
        # 1.75th of the two in (120 s, 300 s]: 120 + 180 x 1.75 / 2
        "wait_p95_s": 277.5,
        "ended": {"succeeded": 3, "failed": 1, "timed_out": 2, "cancelled": 1},
        "timeout_rate": 2 / 6,  # C and E, of A B D F C E
        "on_time": 2,
        "on_time_rate": 2 / 6,  # A and D
        "late": 1,
        "promotions": 2,
        "slices": 8,
        "slice_outcomes": {"completed": 2, "continued": 1, "failed": 2, "lost": 1, "yielded": 2},
        "switches": 2,
        "switch_mean_ms": (300 + 400) / 2,
        "gpu_busy_share": 385 / 780,
        "gpu_util_mean": (55 + 107 + 36) / 780,
        "busy_gpu_hours": 385 / 3600,
        "useful_gpu_hours": (80 + 90 + 45) / 3600,
        "cost_per_useful_gpu_hour": PRICE * 780 / (80 + 90 + 45),  # 10.88
    },
}


def assert_matches(got: dict, expected: dict, where: str) -> None:
    for name, value in expected.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value), f"{where}.{name}"
        else:
            assert got[name] == value, f"{where}.{name}"


def test_summary_matches_the_kpis_worked_out_by_hand(fixture):
    report = kpis.summary(SINCE, UNTIL)

    for tier in ("RT", "HP", "SP", "BP", "BK"):
        assert_matches(report["tiers"][tier], EXPECTED[tier], tier)
    assert_matches(report["overall"], EXPECTED["overall"], "overall")
    assert report["gpus"]["workers"] == 3
    assert report["gpus"]["capacity_gpu_hours"] == pytest.approx(13 / 60)
    assert report["gpus"]["busy_share"] == pytest.approx(385 / 780)
    assert report["gpus"]["util_mean"] == pytest.approx(198 / 780)
    assert (report["since"], report["until"], report["minutes"]) == (SINCE, UNTIL, 10)
    assert report["rolled_up_until"] == t("10:10:00")
    assert report["gpu_hour_price"] == PRICE


@pytest.mark.parametrize(("since", "until"), [("09:00:00", "11:00:00"), ("09:30:00", "11:30:00")])
def test_whole_hours_are_read_from_the_hourly_rows_with_the_same_result(fixture, since, until):
    from clockq.kpis.models import GpuHour, KpiHour

    assert KpiHour.objects.filter(hour=t("10:00:00")).count() == 5  # a row per tier
    assert GpuHour.objects.filter(hour=t("10:00:00")).count() == 3
    assert [p[0].__name__ for p in kpis.periods(t(since), t(until))] == (
        ["KpiHour"] if since == "09:00:00" else ["KpiMinute", "KpiHour", "KpiMinute"]
    )
    report = kpis.summary(t(since), t(until))
    for tier in ("RT", "HP", "SP", "BP", "BK"):
        assert_matches(report["tiers"][tier], EXPECTED[tier], tier)
    assert_matches(report["overall"], EXPECTED["overall"], "overall")
    assert report["gpus"]["capacity_gpu_hours"] == pytest.approx(13 / 60)


def test_the_api_serves_the_same_kpis(fixture, client, alice):
    response = client.get(
        "/api/kpis", {"since": "2026-12-01T10:00:00Z", "until": "2026-12-01T10:10:00Z"}, **token_auth(alice)
    )

    assert response.status_code == 200
    body = response.json()
    for tier in ("RT", "HP", "SP", "BP", "BK"):
        assert_matches(body["tiers"][tier], EXPECTED[tier], tier)
    assert_matches(body["overall"], EXPECTED["overall"], "overall")
    assert body["since"] == "2026-12-01T10:00:00Z" and body["until"] == "2026-12-01T10:10:00Z"


def test_a_window_is_widened_to_whole_minutes(fixture):
    # 10:04:30 - 10:06:10 covers the minutes 10:04 to 10:06: F1 (BK, 45 s), F2 (BK, 90 s), B's end
    report = kpis.summary(t("10:04:30"), t("10:06:10"))

    assert (report["since"], report["until"], report["minutes"]) == (t("10:04:00"), t("10:07:00"), 3)
    assert report["tiers"]["BK"]["busy_gpu_hours"] == pytest.approx(135 / 3600)
    assert report["tiers"]["HP"]["ended"]["succeeded"] == 1  # B at 10:05
    assert report["tiers"]["SP"]["ended"]["timed_out"] == 1  # C at 10:06
    assert report["gpus"]["capacity_gpu_hours"] == pytest.approx(3 / 60)  # gpu0 10:04, gpu1 10:05 and 10:06


def test_series_gives_each_minute_per_tier_and_gpu(fixture):
    series = kpis.series(SINCE, UNTIL)

    assert series["step_s"] == 60 and len(series["t"]) == 10 and series["t"][0] == SINCE
    assert series["tiers"] == ["RT", "HP", "SP", "BP", "BK"]
    assert series["started"]["HP"] == [1, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # A at 10:00, B at 10:03
    assert series["timed_out"]["SP"] == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    assert series["on_time"]["SP"] == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0]
    # Sampled once, at 10:10:30 for the minute 10:09: H (SP, promoted or not) and I (BP) wait.
    assert series["queue_depth"]["SP"][9] == 1 and series["queue_depth"]["BP"][9] == 1
    assert series["queue_depth"]["RT"][9] == 0
    assert series["queue_depth"]["SP"][8] is None  # no row: the rollup did not run then
    gpu0 = series["gpus"]["gpu0@h"]
    assert gpu0["gpu_index"] == 0
    assert gpu0["busy"] == pytest.approx([0.5, 50 / 60, 10 / 60, None, 0.75, None, None, 40 / 60, None, 0.0])
    assert series["gpus"]["gpu2@h"]["busy"] == [None] * 9 + [0.0]  # alive and idle in 10:09


def test_series_adds_up_long_windows_in_steps(fixture):
    series = kpis.series(SINCE, UNTIL, step_minutes=5)

    assert series["step_s"] == 300 and series["t"] == [SINCE, t("10:05:00")]
    assert series["started"]["HP"] == [2, 0]
    # gpu1: 10:01-10:03 busy 60 + 50 + 10 s; 10:05, 10:06 busy 60 + 30 s and alive, idle, in 10:09
    assert series["gpus"]["gpu1@h"]["busy"] == pytest.approx([(60 + 50 + 10) / 180, (60 + 30 + 0) / 180])


def rows() -> tuple[list, list]:
    kpi = KpiMinute.objects.order_by("minute", "tier_id").values()
    gpu = GpuMinute.objects.order_by("minute", "worker").values()
    return [{k: v for k, v in r.items() if k != "id"} for r in kpi], [
        {k: v for k, v in r.items() if k != "id"} for r in gpu
    ]


def test_the_rollup_is_idempotent(fixture):
    before = rows()

    kpis.rollup(NOW)
    kpis.rollup(NOW)

    assert rows() == before


def test_a_slice_written_late_is_picked_up_by_the_trailing_recompute(fixture):
    # Given a lost slice the reaper writes at 10:11:05, for a lease that expired at 10:08:20
    late_job = Job.objects.get(original_tier__code="BP")
    make_slice(late_job, 2, "10:08:00 - 10:08:20", 0, None, "lost")
    # and one so old that no run recomputes its minute any more (5 minutes back at most)
    make_slice(late_job, 2, "10:02:00 - 10:02:20", 0, None, "lost")

    kpis.rollup(NOW + timedelta(minutes=1))

    minute = KpiMinute.objects.get(minute=t("10:08:00"), tier__code="BP")
    assert minute.slices == 1 and minute.slice_outcomes == {"lost": 1} and minute.busy_ms == 20_000
    assert GpuMinute.objects.get(minute=t("10:08:00"), worker="gpu2@h").busy_ms == 20_000
    assert not KpiMinute.objects.filter(minute=t("10:02:00"), tier__code="BP").exists()


def test_capacity_is_recorded_for_the_minutes_since_the_last_run(fixture):
    # Given the next run three minutes later, with gpu1@h gone
    client().delete(heartbeat.KEY_PREFIX + "gpu1@h")

    kpis.rollup(NOW + timedelta(minutes=3))

    live = GpuMinute.objects.filter(minute__gte=t("10:10:00")).values_list("minute", "worker")
    assert sorted(live) == [(t(f"10:1{m}:00"), w) for m in (0, 1, 2) for w in ("gpu0@h", "gpu2@h")]
    assert GpuMinute.objects.filter(minute=t("10:09:00")).count() == 3  # kept when recomputed


def test_the_first_rollup_with_no_jobs_marks_the_last_minute():
    written = kpis.rollup(NOW)

    assert written == 0
    assert KpiMinute.objects.filter(minute=t("10:09:00")).count() == QueueTier.objects.count()
    assert kpis.summary(SINCE, UNTIL)["rolled_up_until"] == t("10:10:00")


def test_rows_older_than_the_retention_are_deleted(fixture, settings):
    settings.CLOCKQ_KPI_RETENTION_DAYS = 1

    kpis.rollup(NOW + timedelta(days=1, minutes=5))

    assert not KpiMinute.objects.filter(minute__lt=t("10:15:00")).exists()
    assert not GpuMinute.objects.filter(minute__lt=t("10:15:00")).exists()


def test_a_backfill_that_runs_out_of_time_goes_on_at_the_next_run_and_ends_the_same(alice):
    # Given three hours of history: a job and a slice in each hour
    for hour in (7, 8, 9):
        job = make_job(
            alice,
            "SP",
            f"{hour}:10:00",
            state="succeeded",
            started=f"{hour}:20:00",
            wait_s=600,
            finished=f"{hour}:40:00",
        )
        make_slice(job, 0, f"{hour}:20:00 - {hour}:40:00", 1200, 0.5, "completed")

    # When each run may do one chunk (an hour) only
    runs = 0
    while kpis.summary(SINCE, UNTIL)["rolled_up_until"] != t("10:10:00"):
        kpis.rollup(NOW, budget_s=0)
        runs += 1
        assert runs < 10
    in_pieces = rows()

    # Then it took several runs, and gave the rows that one run without a budget gives
    assert runs > 1
    KpiMinute.objects.all().delete()
    kpis.rollup(NOW, budget_s=float("inf"))
    assert rows() == in_pieces
    assert kpis.summary(t("07:00:00"), t("10:00:00"))["overall"]["started"] == 3


def test_the_first_run_backfills_only_what_retention_keeps(alice, settings, monkeypatch):
    # Given a job submitted 30 days ago and a retention of 1 day
    settings.CLOCKQ_KPI_RETENTION_DAYS = 1
    old = make_job(alice, "SP", "10:00:00", state="succeeded", started="10:01:00", wait_s=60, finished="10:02:00")
    Job.objects.filter(pk=old.pk).update(submitted_at=t("10:00:00") - timedelta(days=30))
    windows = []
    roll = kpi_rollup._roll
    monkeypatch.setattr(kpi_rollup, "_roll", lambda start, end, *rest: windows.append(start) or roll(start, end, *rest))

    kpis.rollup(NOW, budget_s=float("inf"))

    # Then it starts a day back, not 30 (and no row is older than that)
    assert windows[0] == t("10:10:00") - timedelta(days=1)
    assert len(windows) == 24  # hours
    assert KpiMinute.objects.order_by("minute").first().minute == t("10:01:00")
