"""The job page stays the same size however long the job ran: the newest 20 slices and events,
paginated listings of all of them, and a slice timeline of at most a few hundred spans."""

from __future__ import annotations

import html
import itertools
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clockq.jobs.models import Job, JobEvent, QueueTier, Slice
from tests.helpers import submit
from webapp import job_page

pytestmark = pytest.mark.django_db


def add_slices(job: Job, count: int, *, every_ms: int = 100) -> None:
    """`count` slices of 50 ms, one every `every_ms`, written as the worker would leave them: mostly
    continued, every 7th yielded, every 50th preempted by an RT job, the 500th failed, the last one
    completed; one event per slice that yielded or failed (stamped now: JobEvent.at is
    auto_now_add), in the slices' order."""
    t0 = timezone.now() - timedelta(milliseconds=every_ms * count)
    slices, events = [], []
    for i in range(count):
        start = t0 + timedelta(milliseconds=every_ms * i)
        outcome, preempted = "continued", False
        if i == count - 1:
            outcome = "completed"
        elif i == 499:
            outcome = "failed"
        elif i % 7 == 6:
            outcome, preempted = "yielded", i % 50 == 6
        slices.append(
            Slice(
                job=job,
                worker="gpu0@t",
                gpu_index=0,
                started_at=start,
                ended_at=start + timedelta(milliseconds=50),
                planned_ms=50,
                used_ms=50,
                steps=5,
                outcome=outcome,
                preempted=preempted,
                last_step=5 * (i + 1),
            )
        )
        if outcome in ("yielded", "failed"):
            events.append(
                JobEvent(job=job, at=start, from_state="running", to_state="queued", reason=f"slice {i}", actor="w")
            )
    Slice.objects.bulk_create(slices, batch_size=2000)
    JobEvent.objects.bulk_create(events, batch_size=2000)
    Job.objects.filter(pk=job.pk).update(slice_count=count, state="succeeded")


def render(client, job: Job, query: str = "") -> tuple[str, int]:
    """The page's HTML and the number of SQL queries it took."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/jobs/{job.pk}/{query}")
    assert response.status_code == 200
    return response.content.decode(), len(queries)


def timeline_of(page: str) -> dict:
    found = re.search(r'<script id="slice-timeline-data" type="application/json">(.*?)</script>', page, re.S)
    assert found, "no timeline data on the page"
    return json.loads(found.group(1))


def test_the_page_weighs_the_same_and_takes_the_same_queries_for_20_or_10000_slices(client, alice):
    jobs = {}
    for count in (20, 5_000, 10_000):
        jobs[count] = submit(alice, name=f"long-{count}")
        add_slices(jobs[count], count)
    client.force_login(alice)
    render(client, jobs[20])  # the session and the templates, loaded once

    pages = {count: render(client, job) for count, job in jobs.items()}
    sizes = {count: len(page.encode()) for count, (page, _) in pages.items()}
    queries = {count: n for count, (_, n) in pages.items()}

    print(f"\nJOB PAGE: bytes by slice count {sizes}; SQL queries {queries}")
    assert queries[20] == queries[5_000] == queries[10_000], queries
    # The HTML and its inline data (the timeline) do not grow with the slices: past the timeline's
    # span limit, twice the slices weigh the same, give or take the digits of the counts.
    assert abs(sizes[10_000] - sizes[5_000]) < 1_000, sizes
    assert sizes[10_000] - sizes[20] < job_page.TIMELINE_SPANS * 80, sizes  # about 58 bytes a span
    assert sizes[10_000] < 64_000, sizes
    for count, (page, _) in pages.items():
        timeline = timeline_of(page)
        assert timeline["slices"] == count
        assert len(timeline["spans"]) <= job_page.TIMELINE_SPANS
    big = pages[10_000][0]
    assert big.count("(newest first)") == 2
    assert f"The newest {job_page.RECENT} of 10,000." in big and 'href="?show=slices#slices"' in big
    assert 'href="?show=events#events"' in big
    small = pages[20][0]
    assert "?show=slices" not in small and "?show=events" not in small  # nothing more to show


def test_the_newest_20_slices_and_events_are_shown_newest_first(client, alice):
    job = submit(alice, name="long")
    add_slices(job, 300)
    client.force_login(alice)
    page, _ = render(client, job)
    rows = re.findall(r"<table class=\"slices\">(.*?)</table>", page, re.S)[0].split("<tr><td>")[1:]
    assert len(rows) == job_page.RECENT
    assert "completed" in rows[0]  # the last slice first
    events = re.findall(r"<table class=\"events\">(.*?)</table>", page, re.S)[0]
    shown = re.findall(r"</td><td>\w*</td><td>\w+</td><td>([^<]+)</td>", events)
    # The slices' events (every 7th yielded), newest first; the submission, oldest, is not shown.
    assert shown == [f"slice {i}" for i in range(293, 0, -7)][: job_page.RECENT]


def test_show_all_pages_through_every_slice_100_at_a_time(client, alice):
    job = submit(alice, name="long")
    add_slices(job, 250)
    client.force_login(alice)

    seen = []
    for number in (1, 2, 3):
        page, _ = render(client, job, f"?show=slices&page={number}")
        assert "Slices: all 250, newest first" in page
        assert f"page {number} of 3" in page
        table = re.findall(r"<table class=\"slices\">(.*?)</table>", page, re.S)[0]
        seen += re.findall(r'<time datetime="([^"]+)"', table)
    assert len(seen) == len(set(seen)) == 250
    assert seen == sorted(seen, reverse=True)

    # A page past the end shows the last; one that is not a number, the first.
    assert "page 3 of 3" in render(client, job, "?show=slices&page=99")[0]
    assert "page 1 of 3" in render(client, job, "?show=slices&page=abc")[0]
    events, _ = render(client, job, "?show=events")
    assert f"Events: all {job.events.count()}, newest first" in events and "page 1 of 1" in events


def test_an_unknown_listing_is_a_clear_400(client, alice):
    job = submit(alice, name="x")
    client.force_login(alice)
    response = client.get(f"/jobs/{job.pk}/?show=everything")
    assert response.status_code == 400


def test_what_a_running_jobs_work_folder_holds_and_its_storage_faults_are_on_its_page_and_in_the_api(client, alice):
    """The owner sees why the quota is used while the job runs, and how near it is to failing for
    its storage faults; a job that holds nothing shows neither."""
    job = submit(alice, name="x")
    client.force_login(alice)
    page, _ = render(client, job)
    assert "Work folder" not in page and "Storage faults" not in page
    Job.objects.filter(pk=job.pk).update(state="running", work_bytes=3 * 1024 * 1024, work_files=12, storage_faults=2)
    page, _ = render(client, job)
    assert re.search(r'class="work-folder">3\.0\xa0MB in 12 files', page), page
    assert re.search(r'class="storage-faults">2 of 3:', page)
    answer = client.get(f"/api/jobs/{job.pk}").json()
    assert (answer["work_bytes"], answer["work_files"], answer["storage_faults"]) == (3 * 1024 * 1024, 12, 2)


def test_the_timeline_merges_neighbours_past_its_limit_and_keeps_every_slice_and_outcome(alice):
    job = submit(alice, name="long")
    add_slices(job, 10_000)

    timeline = job_page.slice_timeline(job.pk)
    spans = timeline["spans"]
    kinds = timeline["kinds"]
    assert timeline["merged"] and len(spans) <= job_page.TIMELINE_SPANS
    assert sum(span[3] for span in spans) == 10_000
    totals = [sum(span[4][i] for span in spans) for i in range(len(kinds))]
    by_kind = dict(zip(kinds, totals, strict=True))
    assert by_kind == {
        "continued": 10_000 - 1428 - 1 - 1,  # 1428: i % 7 == 6 below 10,000
        "completed": 1,
        "yielded": 1428 - 29,
        "preempted": 29,  # i % 350 == 6
        "lost": 0,
        "failed": 1,
    }
    # In time order, each span ending before the next starts, the whole run covered.
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert spans[0][0] == 0 and spans[-1][1] == 9_999 * 100 + 50
    # A span shows the most notable way one of its slices ended.
    assert [kinds[s[2]] for s in spans if s[4][kinds.index("failed")]] == ["failed"]
    assert kinds[spans[-1][2]] in ("completed", "preempted", "yielded")


def test_a_short_job_gets_one_span_per_slice(alice):
    job = submit(alice, name="short")
    add_slices(job, 8)
    timeline = job_page.slice_timeline(job.pk)
    kinds = timeline["kinds"]
    assert not timeline["merged"]
    assert [(s[0], s[1], kinds[s[2]], s[3]) for s in timeline["spans"]] == [
        (100 * i, 100 * i + 50, "preempted" if i == 6 else "completed" if i == 7 else "continued", 1) for i in range(8)
    ]
    assert job_page.slice_timeline(submit(alice, name="new").pk) is None  # no slice yet: no timeline


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/clockq/workers/run/steps.py", line 88, in run_steps\n'
    "    workload.step(state)\n"
    '  File "/srv/clockq/workers/builtin/synthetic.py", line 40, in step\n'
    "    raise RuntimeError(f'injected failure at step {step}')\n"
    "RuntimeError: injected failure at step 3\n"
)


@pytest.fixture
def failed_job(alice):
    job = submit(alice, name="broken")
    Job.objects.filter(pk=job.pk).update(state="failed", last_error=TRACEBACK, failures=4)
    return job


def test_the_owner_sees_the_error_in_one_line_and_staff_see_the_traceback(client, alice, carol, failed_job):
    client.force_login(alice)
    page, _ = render(client, failed_job)
    assert '<p class="error-line"><code>RuntimeError: injected failure at step 3</code></p>' in page
    assert "/srv/clockq" not in page and "Traceback" not in page

    client.force_login(carol)
    page, _ = render(client, failed_job)
    assert '<p class="error-line"><code>RuntimeError: injected failure at step 3</code></p>' in page
    assert '<details class="traceback"><summary>Full error (staff only)</summary><pre>Traceback' in page
    assert "/srv/clockq/workers/run/steps.py" in page


def test_the_api_gives_the_one_line_to_everyone_and_the_traceback_to_staff_only(client, alice, carol, failed_job):
    for user, traceback in ((alice, None), (carol, TRACEBACK)):
        client.force_login(user)
        one = client.get(f"/api/jobs/{failed_job.pk}").json()
        listed = client.get("/api/jobs").json()["results"][0]
        for answer in (one, listed):
            assert answer["last_error"] == "RuntimeError: injected failure at step 3"
            assert answer["last_error_traceback"] == traceback

    fine = submit(alice, name="fine")
    answer = client.get(f"/api/jobs/{fine.pk}").json()  # carol, staff
    assert (answer["last_error"], answer["last_error_traceback"]) == ("", None)


def test_the_schema_describes_both_error_fields(client):
    schema = client.get("/api/schema?format=json").json()
    job = schema["components"]["schemas"]["Job"]["properties"]
    assert job["last_error"]["type"] == "string" and "one line" in job["last_error"]["description"]
    assert job["last_error_traceback"]["nullable"] is True
    assert "Staff only" in job["last_error_traceback"]["description"]


def test_a_promoted_jobs_page_gives_the_promotions_reason_in_full_however_old(client, alice):
    job = submit(alice, name="starved")
    reason = "promoted SP -> HP: skipped in 3 consecutive rounds while 12 slice(s) went to other jobs in the last round"
    JobEvent.objects.create(job=job, from_state="queued", to_state="queued", reason=reason, actor="promotion tick")
    Job.objects.filter(pk=job.pk).update(tier=QueueTier.objects.get(code="HP"))
    add_slices(job, 300)  # 43 newer events push the promotion out of the newest 20
    client.force_login(alice)
    page, _ = render(client, job)
    shown = re.search(r'promoted</strong> from SP<br><span class="promotion-reason">([^<]*)</span>', page)
    assert shown and html.unescape(shown.group(1)) == reason


def test_dates_params_and_durations_read_one_way_on_the_job_pages(client, alice):
    job = submit(alice, "HP", name="one-way", steps=50, step_ms=2)
    started = datetime(2026, 12, 2, 19, 9, 56, tzinfo=UTC)
    Job.objects.filter(pk=job.pk).update(first_started_at=started, first_wait_ms=1500, wait_ms=90_000, run_ms=7_500_000)
    client.force_login(alice)

    page, _ = render(client, job)
    assert '<dt>First started</dt><dd><time datetime="2026-12-02T19:09:56.000+00:00"' in page
    assert ">2026-12-02 19:09:56</time>" in page
    assert "started after 1.5 s (target 1 min)" in page  # HP wait target: 60,000 ms
    assert "<dd>1 min 30 s / 2 h 5 min</dd>" in page
    (params,) = re.findall(r'<pre class="params">(.*?)</pre>', page, re.S)
    assert json.loads(html.unescape(params)) == Job.objects.get(pk=job.pk).params  # JSON, not a Python dict
    assert params.startswith("{\n  &quot;steps&quot;: 50,\n")  # too long for one line: indented
    listing = client.get("/jobs/").content.decode()
    for text in (page, listing):
        assert not re.search(r"\b(a\.m\.|p\.m\.|noon|midnight)|\b[A-Z][a-z]{2}\. \d", text)  # Django's default
    assert re.search(
        r'<td><time datetime="[^"]+" data-precision="s" title="UTC">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>', listing
    )


def test_a_slice_paused_for_an_rt_job_says_so_beside_its_service(client, alice):
    job = submit(alice, name="paused")
    add_slices(job, 2)
    Slice.objects.filter(job=job, outcome="continued").update(paused_ms=12.4)
    client.force_login(alice)

    page, _ = render(client, job)

    rows = re.findall(r"<table class=\"slices\">(.*?)</table>", page, re.S)[0].split("<tr><td>")[1:]
    assert "paused" not in rows[0] and "(paused 12 ms for RT)" in rows[1]
