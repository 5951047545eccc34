"""The staff dashboard: who may see it, and what /dashboard/data says about a small fixture.

The fixture's event reasons come from the policy's own rules (promotion, batch chance, making way
for RT), so a reworded reason that the dashboard would no longer recognise fails here.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from clockq.kpis import reports as kpis
from clockq.policy import promotion as rules
from clockq.policy.kpis import WAIT_BUCKETS_MS, floor_minute
from clockq.policy.making_way import MakeWay
from clockq.policy.ordering import Standing
from clockq.policy.slicing import Boundary, decide_at_boundary
from tests.helpers import submit
from webapp.dashboard_series import plotly_time
from webapp.dashboard_timeline import slice_timeline

pytestmark = pytest.mark.django_db

GPU0, GPU1 = "gpu0@host", "gpu1@host"


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    for path in ("/dashboard", "/dashboard/data"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"] == f"/accounts/login/?next={path}"


def test_a_user_who_is_not_staff_is_refused(client, alice):
    client.force_login(alice)
    assert client.get("/dashboard").status_code == 403
    assert client.get("/dashboard/data").status_code == 403
    assert "Dashboard" not in client.get("/jobs/").content.decode()  # no link to it either


def test_staff_get_the_page_with_plotly_served_from_the_wheel(client, carol):
    client.force_login(carol)
    page = client.get("/dashboard")
    assert page.status_code == 200
    html = page.content.decode()
    assert '<script src="/static/plotly/plotly.min.js">' in html
    assert '<script src="/static/webapp/dashboard.js">' in html
    assert "https://" not in html and "http://" not in html  # nothing from the internet
    for chart in ("queue", "oldest", "waits", "gpus", "rates", "load", "timeline"):
        assert f'id="chart-{chart}"' in html
    assert 'href="/dashboard"' in client.get("/jobs/").content.decode()  # the staff nav link


def test_the_empty_system_answers_with_every_section(client, carol):
    client.force_login(carol)
    data = client.get("/dashboard/data").json()
    assert [t["code"] for t in data["tiers"]] == ["RT", "HP", "SP", "BP", "BK"]
    assert data["tiers"][1]["wait_target_ms"] == 60_000
    assert data["live"]["queued"] == {"RT": 0, "HP": 0, "SP": 0, "BP": 0, "BK": 0}
    assert data["timeline"]["bars"] == [] and data["timeline"]["promotions"] == []
    assert set(data) == {"now", "window", "tiers", "live", "fine", "kpis", "timeline", "load"}
    assert data["window"]["minutes"] == 15  # the last 15 minutes unless the URL says otherwise
    assert data["fine"]["available"] and data["fine"]["t"] == [] and data["fine"]["queued"]["RT"] == []
    assert data["load"]["samples"] == [] and data["load"]["forecasts"] == []
    assert data["load"]["latest"] is None and data["load"]["control"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [("minutes=7", "minutes"), ("minutes=abc", "minutes"), ("timeline_s=-1", "timeline_s")],
)
def test_a_bad_window_gets_a_400_that_names_the_field(client, carol, query, field):
    client.force_login(carol)
    response = client.get(f"/dashboard/data?{query}")
    assert response.status_code == 400
    assert field in response.json()["errors"]


def make_slice(job, worker, start, ms, outcome, gpu=None):
    return Slice.objects.create(
        job=job,
        worker=worker,
        gpu_index=int(worker[3]) if gpu is None else gpu,
        started_at=start,
        ended_at=start + timedelta(milliseconds=ms),
        planned_ms=ms,
        used_ms=ms,
        outcome=outcome,
    )


def make_event(job, at, reason, actor="gpu0@host"):
    event = JobEvent.objects.create(job=job, from_state="queued", to_state="queued", reason=reason, actor=actor)
    JobEvent.objects.filter(pk=event.pk).update(at=at)  # `at` is auto_now_add


@pytest.fixture
def busy_pool(alice):
    """Two GPUs over the last minute. GPU 0: an HP job for two slices (the first continued), a
    switch to an SP job that makes way for a waiting RT job, then the RT job. GPU 1: an SP job
    promoted by the tick runs its one slice in HP; a BP job got a batch chance."""
    now = timezone.now()
    t0 = now - timedelta(seconds=60)
    hp = submit(alice, tier="HP", name="finetune")
    sp = submit(alice, tier="SP", name="train-a")
    rt = submit(alice, tier="RT", name="inference")
    starved = submit(alice, tier="SP", name="starved")
    nightly = submit(alice, tier="BP", name="nightly")
    waiting = submit(alice, tier="SP", name="waiting")

    make_slice(hp, GPU0, t0, 100, "continued")
    make_slice(hp, GPU0, t0 + timedelta(milliseconds=100), 100, "yielded")
    made_way = make_slice(sp, GPU0, t0 + timedelta(milliseconds=200), 30, "yielded")
    for_rt = MakeWay(Standing(0, 0, 0.0, 0.0, job_id=rt.pk), Standing(2, 0, 0.0, 0.0, job_id=sp.pk), -1, 0, True)
    rt_reason = decide_at_boundary(Boundary(done=False, making_way=for_rt, cut_short=True)).reason
    make_event(sp, made_way.ended_at - timedelta(milliseconds=2), rt_reason)
    make_slice(rt, GPU0, t0 + timedelta(milliseconds=240), 10, "completed")

    round_facts = rules.RoundFacts(started_at=t0, slices_started=4, jobs_that_started={hp.pk})
    promotion = rules.decide_round(
        round_facts,
        [rules.WaitingJob(starved.pk, "SP", "SP", 2, t0 - timedelta(minutes=1))],
        {"SP": rules.TierRule("SP", 3, "HP")},
    ).promotions[0]
    make_event(starved, t0 + timedelta(seconds=5), promotion.reason, actor="promotion tick")
    promoted = make_slice(starved, GPU1, t0 + timedelta(seconds=6), 50, "yielded")
    # Written by the worker at the end of the promoted slice (workers/slice_runner.py).
    make_event(starved, promoted.ended_at - timedelta(milliseconds=1), "returned to SP after 0.1 s of service in HP")
    make_slice(starved, GPU1, t0 + timedelta(seconds=7), 50, "yielded")  # back home: not promoted

    chance = rules.batch_chance([rules.WaitingJob(nightly.pk, "BP", "BP", 0, t0)], tier="BP", jobs=1, to_tier="SP")[0]
    make_event(nightly, t0 + timedelta(seconds=8), chance.reason, actor="batch chance")
    Job.objects.filter(pk=nightly.pk).update(tier=QueueTier.objects.get(code="SP"))  # promoted, waiting

    # Old news: outside the two-minute timeline.
    make_slice(waiting, GPU1, now - timedelta(minutes=10), 50, "yielded")
    Job.objects.filter(pk__in=[hp.pk, sp.pk, rt.pk, starved.pk]).update(state="succeeded")
    return {"hp": hp, "sp": sp, "rt": rt, "starved": starved, "nightly": nightly, "waiting": waiting}


def test_the_timeline_holds_bars_switches_preemptions_and_promotions(client, carol, busy_pool):
    client.force_login(carol)
    timeline = client.get("/dashboard/data?timeline_s=120").json()["timeline"]
    hp, sp, rt, starved, nightly = (busy_pool[k].pk for k in ("hp", "sp", "rt", "starved", "nightly"))

    assert timeline["workers"] == [{"worker": GPU0, "gpu": 0}, {"worker": GPU1, "gpu": 1}]
    bars = [(b["worker"], b["job"], b["tier"], b["ran_in"], b["slices"], b["outcome"]) for b in timeline["bars"]]
    assert bars == [
        (GPU0, hp, "HP", "HP", 2, "yielded"),  # the continued slice and the next are one stay
        (GPU0, sp, "SP", "SP", 1, "yielded"),
        (GPU0, rt, "RT", "RT", 1, "completed"),
        (GPU1, starved, "SP", "HP", 1, "yielded"),  # its one slice in HP
        (GPU1, starved, "SP", "SP", 1, "yielded"),
    ]
    assert [b["ms"] for b in timeline["bars"]] == [200, 30, 10, 50, 50]
    assert [b["preempted"] for b in timeline["bars"]] == [False, True, False, False, False]
    assert [b["promoted"] for b in timeline["bars"]] == [False, False, False, True, False]

    switches = [(s["worker"], s["from_job"], s["to_job"], s["after"]) for s in timeline["switches"]]
    assert switches == [(GPU0, hp, sp, "yielded"), (GPU0, sp, rt, "yielded")]

    promotions = [(p["job"], p["tier"], p["actor"], p["reason"].split(":")[0]) for p in timeline["promotions"]]
    assert promotions == [
        (starved, "SP", "promotion tick", "promoted SP -> HP"),
        (nightly, "BP", "batch chance", "batch chance"),
    ]
    assert timeline["truncated"] is False


def test_the_live_figures_count_what_waits_now(client, carol, busy_pool):
    client.force_login(carol)
    live = client.get("/dashboard/data").json()["live"]
    # Per own tier: `nightly`, promoted into SP's queue for its batch chance, is still BP's.
    assert live["queued"] == {"RT": 0, "HP": 0, "SP": 1, "BP": 1, "BK": 0}
    assert live["promoted_waiting"] == 1


def test_the_timeline_keeps_the_newest_slices_when_there_are_too_many(client, carol, alice, settings):
    job = submit(alice, tier="BK", name="many")
    start = timezone.now() - timedelta(seconds=30)
    for i in range(12):
        make_slice(job, GPU0, start + timedelta(milliseconds=100 * i), 100, "yielded")
    timeline = slice_timeline(since=start - timedelta(seconds=1), until=timezone.now(), cap=5)
    assert timeline["truncated"] is True
    assert len(timeline["bars"]) == 5
    assert timeline["bars"][-1]["start"] == plotly_time(start + timedelta(milliseconds=1100))


def test_the_wait_buckets_are_the_policys(client, carol):
    client.force_login(carol)
    html = client.get("/dashboard").content.decode()
    assert f'"waitBucketsMs": [{", ".join(map(str, WAIT_BUCKETS_MS))}]' in html


def test_the_kpi_charts_come_from_the_rollup(client, carol, alice):
    # Given two SP jobs that started two minutes ago, one within SP's 10 min target and on time,
    # one after 700 s and then timed out, a GPU busy for half a minute, and one job waiting
    now = timezone.now()
    minute = floor_minute(now) - timedelta(minutes=2)
    fast, slow = submit(alice, name="fast"), submit(alice, name="slow")
    submit(alice, name="waiting")
    start, end = minute + timedelta(seconds=10), minute + timedelta(seconds=40)
    for job, state, wait_ms in ((fast, "succeeded", 30_000), (slow, "timed_out", 700_000)):
        Job.objects.filter(pk=job.pk).update(
            state=state,
            submitted_at=start - timedelta(milliseconds=wait_ms),
            first_started_at=start,
            first_wait_ms=wait_ms,
            finished_at=end,
        )
    make_slice(fast, GPU0, minute + timedelta(seconds=10), 30_000, "completed")
    client.force_login(carol)
    assert client.get("/dashboard/data").json()["kpis"] is None  # before the first rollup

    # When the rollup has run
    kpis.rollup(now)
    data = client.get("/dashboard/data?minutes=15").json()["kpis"]

    # Then the charts' figures are the rollup's
    sp = data["waits"]["SP"]
    assert (sp["started"], sp["within_target"], sp["mean_s"]) == (2, 0.5, 365.0)
    assert sum(sp["counts"]) == 2 and len(sp["counts"]) == len(WAIT_BUCKETS_MS) + 1
    assert data["waits"]["HP"]["within_target"] is None  # nothing started
    assert data["rates"]["SP"] == {"judged": 2, "on_time": 0.5, "timed_out": 0.5}
    assert data["rates"]["all"] == {"judged": 2, "on_time": 0.5, "timed_out": 0.5}
    at = data["minutes"].index(plotly_time(minute))
    [gpu] = data["gpus"]
    assert (gpu["worker"], gpu["gpu"], gpu["busy"][at]) == (GPU0, 0, 0.5)
    # The depth is sampled at the end of the last complete minute; the minute under way has none.
    sampled = data["minutes"].index(plotly_time(floor_minute(now) - timedelta(minutes=1)))
    assert data["queue_depth"]["SP"][sampled] == 1 and data["queue_depth"]["SP"][-1] is None
    assert data["since"] <= plotly_time(minute) < data["until"]


def test_the_load_section_shows_the_history_the_forecasts_and_the_control_state(client, carol):
    from clockq.control_state import control
    from clockq.forecasting import forecasts
    from clockq.forecasting.models import MetricSample

    now = timezone.now()
    for i in range(5):
        MetricSample.objects.create(at=now - timedelta(minutes=5 - i), load_index=0.5 + 0.1 * i, gpus=2)
    forecasts.record_forecast(value=0.92, model="lstm", reason="lstm model 3: ...", at=now - timedelta(seconds=20))
    control.apply_forecast(0.92, now - timedelta(seconds=20), workers=2)
    control.force_state(actor="carol", prefetch_on=True, note="warming caches")

    client.force_login(carol)
    load = client.get("/dashboard/data").json()["load"]
    assert [s["load"] for s in load["samples"]] == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9])
    assert load["forecasts"] == [
        {"made": load["latest"]["made"], "t": load["latest"]["t"], "value": 0.92, "model": "lstm"}
    ]
    assert load["latest"]["t"] > load["latest"]["made"] and not load["latest"]["stale"]  # drawn 15 min ahead
    state = load["control"]
    assert state["admission_open"] is False and state["prefetch_on"] is True and state["desired_workers"] == 3
    assert state["forced"] and state["forced_by"] == "carol" and "warming caches" in state["reason"]
    assert state["forecast"] == 0.92
    assert load["thresholds"]["close_above"] == 0.85 and load["horizon_s"] == 900
