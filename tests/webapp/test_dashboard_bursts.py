"""The dashboard shows bursts: the queues every 5 s within the last hour, the minute series over
longer windows, the last 15 minutes unless the link names another window.

The burst is what a newcomer saw: 55 jobs, 11 per tier, submitted at once and gone 30 s later.
The samples are the beat task's own function (clockq/jobs/queue_samples.py), called at the slots
beat would call it at; what each counts is the database at that call."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.jobs import queue_samples
from clockq.jobs.models import Job
from clockq.kpis import reports as kpis
from tests.helpers import submit

pytestmark = pytest.mark.django_db

CODES = ("RT", "HP", "SP", "BP", "BK")
PER_TIER = 11


def burst_of_30_s(owner) -> list[Job]:
    """Samples every 5 s around a burst that ended 15 s ago: none waiting, 11 per tier waiting
    for 30 s, then none again (they ran and succeeded)."""
    start = timezone.now() - timedelta(seconds=50)
    queue_samples.record_queue_sample(start - timedelta(seconds=5))
    burst = [submit(owner, code, f"burst-{code}-{i}") for code in CODES for i in range(PER_TIER)]
    Job.objects.filter(pk__in=[j.pk for j in burst]).update(submitted_at=start)
    for s in range(0, 30, 5):
        queue_samples.record_queue_sample(start + timedelta(seconds=s))
    Job.objects.filter(pk__in=[j.pk for j in burst]).update(
        state="succeeded", first_started_at=start + timedelta(seconds=30), finished_at=start + timedelta(seconds=31)
    )
    queue_samples.record_queue_sample(start + timedelta(seconds=30))
    return burst


def test_a_30_s_burst_shows_every_5_s_where_the_minute_sample_misses_it(client, carol, alice):
    # Given a 30 s burst of 11 jobs per tier, over by the time the KPI rollup samples the depth
    burst_of_30_s(alice)
    kpis.rollup(timezone.now())
    client.force_login(carol)

    # When the dashboard asks for its default window
    data = client.get("/dashboard/data").json()

    # Then the 5 s series has the burst at its height in every tier, and its longest waits
    fine = data["fine"]
    assert fine["available"] and fine["step_s"] == 5
    assert len(fine["t"]) == 8  # before, six slots of the burst, after
    for code in CODES:
        assert fine["queued"][code] == [0, *[PER_TIER] * 6, 0]
        assert fine["oldest_wait_s"][code] == [0.0, 0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 0.0]
    assert max(fine["load_index"], key=lambda v: v or 0) is None  # no GPU worker in this test
    # while the minute series, sampled after the burst, shows none of it
    depth = data["kpis"]["queue_depth"]
    assert {code: max(d for d in depth[code] if d is not None) for code in CODES} == dict.fromkeys(CODES, 0)


def test_the_default_window_is_the_last_15_minutes_and_longer_ones_use_the_minute_series(client, carol, alice):
    burst_of_30_s(alice)
    kpis.rollup(timezone.now())
    client.force_login(carol)
    assert client.get("/dashboard/data").json()["window"]["minutes"] == 15
    assert client.get("/dashboard/data?minutes=60").json()["fine"]["queued"]["SP"][1] == PER_TIER
    for minutes in (360, 1440, 10080):
        data = client.get(f"/dashboard/data?minutes={minutes}").json()
        assert data["window"]["minutes"] == minutes
        assert data["fine"] is None  # older than the ring keeps: the page draws the minute series
        assert max(d for d in data["kpis"]["queue_depth"]["SP"] if d is not None) == 0
    assert len(data["kpis"]["minutes"]) <= 1_440 and data["kpis"]["step_s"] > 60  # a week, in steps of minutes


def test_the_page_opens_on_the_windows_its_link_names(client, carol):
    client.force_login(carol)
    html = client.get("/dashboard").content.decode()
    assert '<option value="15" selected>15 min</option>' in html
    assert '<option value="120" selected>2 min</option>' in html
    for value, name in ((60, "1 h"), (360, "6 h"), (1440, "24 h"), (10080, "7 d")):
        assert f'<option value="{value}">{name}</option>' in html

    shared = client.get("/dashboard?minutes=360&timeline_s=600").content.decode()
    assert '<option value="360" selected>6 h</option>' in shared
    assert '<option value="600" selected>10 min</option>' in shared
    assert '<option value="15">15 min</option>' in shared


@pytest.mark.parametrize("query", ["minutes=7", "minutes=1h", "timeline_s=0"])
def test_a_link_with_a_bad_window_gets_a_400_that_says_what_is_allowed(client, carol, query):
    client.force_login(carol)
    response = client.get(f"/dashboard?{query}")
    assert response.status_code == 400
    field = query.split("=")[0]
    assert f"{field} must be one of" in response.content.decode()


def test_without_the_broker_the_5_s_series_says_why_and_the_rest_answers(client, carol, monkeypatch):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from tests.harness import free_port

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr("clockq.jobs.queue_samples.client", lambda: dead)
    client.force_login(carol)
    data = client.get("/dashboard/data").json()
    assert data["fine"]["available"] is False and "broker" in data["fine"]["reason"]
    assert data["live"]["queued"]["SP"] == 0


def test_a_full_hour_of_samples_is_one_bounded_answer_and_a_sample_three_queries(client, carol):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # Given the ring full: more than an hour of 5 s samples with every tier waiting
    now = timezone.now()
    values = {
        "queued": dict.fromkeys(CODES, 1234),
        "oldest_wait_s": dict.fromkeys(CODES, 12345.678),
        "running": 64,
        "gpus": 64,
        "load_index": 1.234567,
    }
    written = [now.timestamp() - 5 * slot for slot in range(queue_samples.KEEP_S // queue_samples.STEP_S + 60)]
    for at in written:
        queue_samples.RING.write(queue_samples.client(), at, values)
    assert queue_samples.client().zcard(queue_samples.RING.key) <= queue_samples.RING.max_samples

    # When the dashboard asks for the last hour
    client.force_login(carol)
    asked = timezone.now().timestamp()
    response = client.get("/dashboard/data?minutes=60")
    answered = timezone.now().timestamp()

    # Then it holds an hour of samples (about 720: the hour ends when the answer is made, and
    # writing the ring took a while on a loaded machine), in a bounded answer. A sample's slot
    # is its time floored to the step, and a slot is in the hour if it starts in it: every
    # sample taken a step or more after the hour's start is there, so at most the two of the
    # 10 s around that start that the count below takes in may be missing.
    def within_the_hour_to(end: float) -> int:
        return sum(end - 3600 - queue_samples.STEP_S <= at for at in written)

    assert within_the_hour_to(answered) - 2 <= len(response.json()["fine"]["t"]) <= within_the_hour_to(asked) + 1
    assert len(response.json()["fine"]["t"]) >= 700
    assert len(response.content) < 160_000

    # And taking a sample costs the database three queries, however many jobs wait
    with CaptureQueriesContext(connection) as queries:
        queue_samples.take_sample()
    assert len(queries) == 3
