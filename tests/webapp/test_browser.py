"""A real browser: headless Chromium (the Debian package) driven by Playwright against the live server.

The same flows as test_pages.py and test_admin.py, but typed and clicked: the login page, the submit
form, the cancel button on the job page, and the admin's hold/release actions. Skipped, saying why,
where /usr/bin/chromium is missing (`make test` installs it when it can).
"""

from __future__ import annotations

import re

import pytest

from clockq.jobs.models import Job
from tests.browser import TIMEOUT_MS, log_in
from tests.helpers import submit

pytestmark = pytest.mark.django_db(transaction=True)  # the live server needs committed rows


@pytest.fixture
def page(browser, live_server, transactional_db):
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def state_on_page(page):
    return page.locator("dt", has_text="State").locator("xpath=following-sibling::dd[1]")


def test_submit_through_the_form_then_a_bad_params_value(page, alice):
    log_in(page, "/accounts/login/", "alice", "alice-pass-123")
    page.get_by_role("link", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/jobs/new$"))

    page.get_by_label("Name").fill("nightly")
    page.get_by_label("Tier").select_option("BP")
    page.get_by_label("Workload").select_option("matmul")
    page.locator("#params-json summary").click()  # the JSON box, collapsed until opened
    page.get_by_label("Params as JSON").fill('{"size": 64, "steps": 10}')
    page.get_by_role("button", name="Submit").click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get()
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert page.get_by_role("heading", level=1).inner_text() == f"Job #{job.pk}: nightly"
    assert page.locator(".messages").inner_text() == f"Job #{job.pk} submitted to BP."
    assert state_on_page(page).inner_text() == "queued"
    assert (job.owner.username, job.state, job.tier.code, job.workload) == ("alice", "queued", "BP", "matmul")
    assert job.params == {"size": 64, "steps": 10}

    # A value out of range: the page says so, keeps what was typed, and nothing is written.
    page.goto("/jobs/new")
    page.get_by_label("Name").fill("too-big")
    page.get_by_label("Workload").select_option("matmul")
    page.locator("#params-json summary").click()
    page.get_by_label("Params as JSON").fill('{"size": 99999}')
    page.get_by_role("button", name="Submit").click()
    page.wait_for_load_state()
    assert page.url.endswith("/jobs/new")
    assert "size: must be between" in page.locator(".errorlist").inner_text()
    assert page.get_by_label("Name").input_value() == "too-big"
    assert Job.objects.count() == 1


def test_cancel_from_the_job_page(page, alice):
    job = submit(alice, name="to-cancel")
    log_in(page, f"/accounts/login/?next=/jobs/{job.pk}/", "alice", "alice-pass-123")
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/$"))
    assert state_on_page(page).inner_text() == "queued"

    page.get_by_role("button", name="Cancel job").click()
    page.wait_for_url(re.compile(rf"/jobs/{job.pk}/$"))
    assert page.locator(".messages").inner_text() == f"Job #{job.pk} cancelled."
    assert state_on_page(page).inner_text() == "cancelled"
    assert page.get_by_role("button", name="Cancel job").count() == 0  # nothing left to cancel
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def run_admin_action(page, action: str, *jobs: Job) -> None:
    page.goto("/admin/jobs/job/")
    for job in jobs:
        page.get_by_role("checkbox", name=f"Select this object for an action - {job}", exact=True).check()
    page.get_by_role("combobox", name=re.compile(r"^Action:")).select_option(label=action)
    page.get_by_role("button", name="Go").click()
    page.wait_for_load_state()


def test_admin_hold_and_release(page, alice, django_user_model):
    django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123")
    first, second, _bystander = (submit(alice, name=n) for n in ("first", "second", "bystander"))
    log_in(page, "/admin/login/?next=/admin/", "root", "root-pass-123")
    page.wait_for_url(re.compile(r"/admin/$"))

    run_admin_action(page, "Hold selected jobs", first, second)
    assert page.locator(".messagelist .success").inner_text() == "Held 2 job(s)."
    states = dict(Job.objects.values_list("name", "state"))
    assert states == {"first": "held", "second": "held", "bystander": "queued"}

    run_admin_action(page, "Release selected held jobs", first, second)
    assert page.locator(".messagelist .success").inner_text() == "Released 2 job(s)."
    assert set(Job.objects.values_list("state", flat=True)) == {"queued"}
    assert list(first.events.values_list("reason", "actor")) == [
        ("submitted to SP", "alice"),
        ("held", "root"),
        ("released", "root"),
    ]


def test_no_admin_for_a_user_who_is_not_staff(page, alice):
    log_in(page, "/accounts/login/", "alice", "alice-pass-123")
    page.wait_for_url(re.compile(r"/jobs/$"))
    assert page.locator("header").get_by_text("alice").is_visible()  # logged in
    assert page.get_by_role("link", name="Admin").count() == 0

    page.goto("/admin/")
    assert re.search(r"/admin/login/\?next=/admin/$", page.url)
    assert "not authorized to access this page" in page.locator("body").inner_text()


def test_the_job_page_draws_its_metric_curves_and_apart_its_slice_timeline(page, alice):
    from datetime import timedelta

    from django.utils import timezone

    from clockq.jobs import metrics
    from clockq.jobs.models import Slice
    from clockq.policy.metrics import Series

    job = submit(alice, name="curves")
    loss = Series()
    for step in range(1, 101):
        loss.add(step, 1.0 / step)
    metrics.save(job.pk, {"loss": loss}, ["loss"])
    now = timezone.now()
    for seconds, step, outcome, preempted in (
        (3, 20, "continued", False),
        (2, 40, "yielded", False),
        (1, 70, "yielded", True),
    ):
        Slice.objects.create(
            job=job,
            worker="gpu0@t",
            gpu_index=0,
            started_at=now - timedelta(seconds=seconds),
            ended_at=now - timedelta(seconds=seconds - 0.5),
            planned_ms=500,
            used_ms=500,
            outcome=outcome,
            last_step=step,
            preempted=preempted,
        )
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    log_in(page, f"/accounts/login/?next=/jobs/{job.pk}/", "alice", "alice-pass-123")

    chart = page.locator("#metrics-chart.js-plotly-plot")
    chart.locator("g.trace.scatter").first.wait_for()
    assert chart.locator("g.trace.scatter").count() == 1  # the loss curve
    assert chart.locator("path.js-line").count() >= 1
    assert page.evaluate("(document.getElementById('metrics-chart').layout.shapes || []).length") == 0  # no slice lines

    timeline = page.locator("#slice-timeline.js-plotly-plot")
    timeline.locator("g.point").first.wait_for()
    assert timeline.locator("g.point").count() == 3  # one span a slice
    drawn = page.evaluate(
        "document.getElementById('slice-timeline').data.map(t => [t.name, t.marker.color, t.x.length])"
    )
    assert drawn == [["continued", "#0969da", 1], ["yielded", "#bf8700", 1], ["preempted", "#d62728", 1]]
    assert errors == []
