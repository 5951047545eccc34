"""The dashboard in a real browser: headless Chromium (the Debian package) driven by Playwright.

Every chart must draw (Plotly's SVG, with traces), the slice timeline must have its bars and
markers, the page must refresh itself in place, and no request may leave this machine: plotly.js
comes from clockq's own static files. Skipped, saying why, where /usr/bin/chromium is missing.
"""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from clockq.jobs.models import Job
from clockq.kpis import reports as kpis
from clockq.policy import promotion as rules
from clockq.policy.kpis import floor_minute
from tests.browser import TIMEOUT_MS, log_in
from tests.helpers import submit
from tests.webapp.test_dashboard import GPU0, GPU1, make_event, make_slice
from tests.webapp.test_dashboard_bursts import CODES, PER_TIER, burst_of_30_s

pytestmark = pytest.mark.django_db(transaction=True)  # the live server needs committed rows

LOCAL_HOSTS = {"localhost", "127.0.0.1", "[::1]", "::1"}
CHARTS = ("queue", "oldest", "waits", "gpus", "rates", "load", "timeline")


@pytest.fixture
def watched_page(browser, live_server, transactional_db):
    """A page whose requests to anywhere but this machine are blocked and written down, and whose
    script errors are kept."""
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(TIMEOUT_MS)
    outside: list[str] = []
    errors: list[str] = []

    def only_local(route):
        if urlsplit(route.request.url).hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_local)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page, outside, errors
    context.close()


@pytest.fixture
def some_slices(alice):
    """Two GPUs busy in the last minute: a switch, an SP job that made way for RT, and an SP job
    promoted by the tick that ran its one slice in HP."""
    t0 = timezone.now() - timedelta(seconds=40)
    hp, sp, rt = (submit(alice, tier=t, name=n) for t, n in (("HP", "finetune"), ("SP", "train"), ("RT", "infer")))
    starved = submit(alice, tier="SP", name="starved")
    make_slice(hp, GPU0, t0, 2_000, "continued")
    make_slice(hp, GPU0, t0 + timedelta(seconds=2), 2_000, "yielded")
    made_way = make_slice(sp, GPU0, t0 + timedelta(seconds=4), 1_500, "yielded")
    make_event(sp, made_way.ended_at, "preempted by a waiting RT job")
    make_slice(rt, GPU0, t0 + timedelta(seconds=5.5), 300, "completed")
    promotion = rules.decide_round(
        rules.RoundFacts(started_at=t0, slices_started=3, jobs_that_started={hp.pk}),
        [rules.WaitingJob(starved.pk, "SP", "SP", 2, t0 - timedelta(minutes=1))],
        {"SP": rules.TierRule("SP", 3, "HP")},
    ).promotions[0]
    make_event(starved, t0 + timedelta(seconds=8), promotion.reason, actor="promotion tick")
    promoted = make_slice(starved, GPU1, t0 + timedelta(seconds=9), 3_000, "yielded")
    make_event(starved, promoted.ended_at, "returned to SP after 0.1 s of service in HP")
    submit(alice, tier="BP", name="waiting")
    Job.objects.filter(pk__in=[hp.pk, rt.pk]).update(state="succeeded")
    # Older history for the per-minute charts: an SP job served within its target and one that
    # timed out, rolled up as the periodic task would.
    minute = floor_minute(t0) - timedelta(minutes=3)
    for name, state, wait_ms in (("on-time", "succeeded", 20_000), ("too-late", "timed_out", 900_000)):
        job = submit(alice, tier="SP", name=name)
        start = minute + timedelta(seconds=5)
        Job.objects.filter(pk=job.pk).update(
            state=state,
            submitted_at=start - timedelta(milliseconds=wait_ms),
            first_started_at=start,
            first_wait_ms=wait_ms,
            finished_at=start + timedelta(seconds=30),
        )
        make_slice(job, GPU1, start, 30_000, "completed")
    kpis.rollup(timezone.now())


def test_every_chart_draws_from_local_files_and_refreshes_in_place(watched_page, carol, some_slices):
    from clockq.control_state import control
    from clockq.forecasting import forecasts
    from clockq.forecasting.models import MetricSample

    now = timezone.now()
    for i in range(3):
        MetricSample.objects.create(at=now - timedelta(minutes=3 - i), load_index=0.4 + 0.2 * i, gpus=2)
    forecasts.record_forecast(value=0.9, model="persistence", reason="persistence: only 3 samples", at=now)
    control.apply_forecast(0.9, now, workers=2)
    page, outside, errors = watched_page
    log_in(page, "/accounts/login/?next=/dashboard", "carol", "carol-pass-123")
    page.wait_for_url(re.compile(r"/dashboard$"))
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 1")

    for chart in CHARTS:
        plot = page.locator(f"#chart-{chart}.js-plotly-plot")
        assert plot.count() == 1, f"{chart} was not drawn"
        assert plot.locator("svg.main-svg").count() >= 1
    # Traces, not only axes.
    assert page.locator("#chart-queue .scatterlayer .trace").count() == 5  # a line per tier
    assert page.locator("#chart-load .scatterlayer .trace path.js-line").count() >= 1  # the load index
    control_text = page.locator("#dash-control").inner_text()
    assert "admission closed" in control_text and "forecast 90.0 % by persistence" in control_text
    assert page.locator("#chart-queue .scatterlayer .trace path.js-line").count() >= 1
    waits = page.locator("#chart-waits .scatterlayer .trace")
    assert waits.count() == 2  # SP's waits, and the targets' markers
    assert page.locator("#chart-waits .legendtext", has_text="SP (2 started)").count() == 1
    assert page.locator("#chart-gpus .scatterlayer .trace path.js-line").count() >= 1  # busy per GPU
    assert page.locator("#chart-rates .barlayer .point path").count() >= 2  # on time and timed out
    assert "waiting for the first KPI rollup" not in page.locator(".charts").inner_text()

    timeline = page.locator("#chart-timeline")
    assert timeline.locator(".barlayer .point path").count() == 4  # one bar per stay on a GPU
    assert timeline.locator(".scatterlayer .trace").count() == 4  # switch, preempted, promoted, promotion
    for name in ("switch", "preempted (RT, HP)", "promoted slice", "promotion", "HP", "SP", "RT"):
        assert timeline.locator(".legend .legendtext", has_text=re.compile(rf"^{re.escape(name)}$")).count() == 1
    assert timeline.locator(".scatterlayer .point").count() >= 4
    labels = timeline.locator(".yaxislayer-above .ytick text")
    top_down = sorted((labels.nth(i).bounding_box()["y"], labels.nth(i).text_content()) for i in range(labels.count()))
    assert [text for _y, text in top_down] == ["promotions", f"GPU 0 · {GPU0}", f"GPU 1 · {GPU1}"]
    tiles = page.locator("#dash-tiles").inner_text()
    assert "SP waiting / running" in tiles
    # A promotion's reason shows in full on hover, in lines that stay inside the chart.
    from clockq.jobs.models import JobEvent

    reason = JobEvent.objects.get(reason__startswith="promoted ").reason
    point = timeline.locator(".scatterlayer .trace").nth(3).locator(".point").first
    point.scroll_into_view_if_needed()
    marker = point.bounding_box()
    x, y = marker["x"] + marker["width"] / 2, marker["y"] + marker["height"] / 2
    page.mouse.move(x - 5, y)
    page.mouse.move(x, y, steps=5)  # Plotly hovers on its own mouse moves, over its drag layer
    hover = timeline.locator(".hoverlayer .hovertext")
    hover.wait_for()
    shown = " ".join(hover.locator("tspan.line").all_text_contents())
    assert reason in shown and hover.locator("tspan.line").count() > 1, shown
    box, chart = hover.bounding_box(), timeline.bounding_box()
    assert chart["x"] <= box["x"] and box["x"] + box["width"] <= chart["x"] + chart["width"]
    # A GPU's hover names its line by the trace's own (escaped) name.
    page.mouse.move(0, 0)
    hover_over(page, page.locator("#chart-gpus .scatterlayer .point").first)
    gpu_hover = page.locator("#chart-gpus .hoverlayer .hovertext")
    gpu_hover.wait_for()
    assert re.fullmatch(r"GPU [01] · gpu[01]@host busy: \d+%", gpu_hover.text_content()), gpu_hover.text_content()

    # It refreshes by itself, redrawing the same plot in place: no reload.
    page.evaluate("window.notReloaded = true")
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 2", timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    page.get_by_label("Timeline over").select_option("300")
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 3")
    assert page.evaluate("window.notReloaded") is True
    assert "not updated" not in page.locator("#dash-status").inner_text()

    assert outside == [], f"the page reached for the internet: {outside}"
    assert errors == []


def intersect(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and (b["y"] < a["y"] + a["height"])
    )


def test_a_burst_shows_in_the_queue_chart_and_the_threshold_labels_stand_apart(watched_page, carol, alice, tmp_path):
    from clockq.bus import heartbeat
    from clockq.bus.client import client as broker
    from clockq.control_state import control

    # Given one GPU worker, and a 30 s burst of 11 jobs per tier that ended before the minute's
    # rollup sampled: the load index went up to its cap, so the axis spans 0-2 and the
    # thresholds crowd together
    heartbeat.announce(broker(), {"hostname": "gpu0@hostA", "gpu": 0, "host": "hostA", "pid": 1, "started": 0.0})
    burst_of_30_s(alice)
    kpis.rollup(timezone.now())
    thresholds = control.thresholds()
    page, outside, errors = watched_page
    page.set_viewport_size({"width": 1400, "height": 1000})
    log_in(page, "/accounts/login/?next=/dashboard", "carol", "carol-pass-123")
    page.wait_for_url(re.compile(r"/dashboard$"))
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 1")

    # Then the queue-depth chart draws the burst at its height in every tier: a marker for each
    # 5 s sample, and an axis that reaches it
    queue = page.locator("#chart-queue")
    drawn = page.evaluate(
        "Object.fromEntries(document.getElementById('chart-queue').data.map((t) => [t.name, Math.max(...t.y)]))"
    )
    assert drawn == dict.fromkeys(CODES, PER_TIER)
    assert page.evaluate("document.getElementById('chart-queue')._fullLayout.yaxis.range[1]") >= PER_TIER
    assert queue.locator(".scatterlayer .trace").nth(0).locator(".point").count() >= 8  # 8 samples, then now
    oldest = page.evaluate("document.getElementById('chart-oldest').data.filter((t) => t.showlegend !== false)")
    assert [max(v for v in t["y"] if v is not None) for t in oldest] == [25.0] * len(CODES)

    load = page.evaluate(
        "Object.fromEntries(document.getElementById('chart-load').data.map((t) => [t.name, Math.max(...t.y)]))"
    )
    assert load["load index (5 s)"] == 2.0  # (0 running + 55 waiting) / 1 GPU, at the cap

    # And the load chart's threshold labels, wherever it draws them, do not overlap: not even
    # reopen < 75 % and scale out > 70 %, five points apart
    assert abs(thresholds.reopen_below - thresholds.scale_out_above) < 0.1
    named = {
        "close admission > ": thresholds.close_above,
        "reopen < ": thresholds.reopen_below,
        "scale out > ": thresholds.scale_out_above,
        "prefetch < ": thresholds.prefetch_below,
    }
    boxes = []
    for name, value in named.items():
        label = page.locator("#chart-load svg text", has_text=f"{name}{100 * value:.1f} %")
        assert label.count() == 1, f"{name} is not labelled once"
        box = label.bounding_box()
        assert box["width"] > 0 and box["height"] > 0, name
        boxes.append((name, box))
    for i, (name, box) in enumerate(boxes):
        for other, other_box in boxes[i + 1 :]:
            assert not intersect(box, other_box), f"{name!r} overlaps {other!r}"
    page.screenshot(path=tmp_path / "dashboard-burst.png", full_page=True)
    assert (tmp_path / "dashboard-burst.png").stat().st_size > 0

    # When another window is picked, the page's own URL says so, and the link opens on it
    page.get_by_label("Window").select_option("60")
    page.wait_for_url(re.compile(r"/dashboard\?minutes=60&timeline_s=120$"))
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 2")
    page.goto(page.url)
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 1")
    assert page.get_by_label("Window").input_value() == "60"
    assert page.evaluate("document.getElementById('chart-queue').data[0].y.length") >= 8

    assert outside == [], f"the page reached for the internet: {outside}"
    assert errors == []


MARKUP_NAME = '<b>bold</b><span style="color:red">x</span>'


def hover_over(page, element) -> None:
    """Move the mouse onto `element` as a person would: Plotly hovers on its own mouse moves."""
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x - 5, y)
    page.mouse.move(x, y, steps=5)


def test_a_job_name_made_of_markup_shows_as_its_own_text_in_the_timeline(watched_page, alice, carol):
    # Given a job of alice's whose name is Plotly markup, that ran a slice on GPU 0 and was promoted
    job = submit(alice, tier="SP", name=MARKUP_NAME)
    start = timezone.now() - timedelta(seconds=20)
    make_slice(job, GPU0, start, 5_000, "completed")
    make_event(job, start - timedelta(seconds=1), "promoted SP -> HP: not started in 3 rounds", actor="promotion tick")
    page, outside, errors = watched_page
    log_in(page, "/accounts/login/?next=/dashboard", "carol", "carol-pass-123")
    page.wait_for_url(re.compile(r"/dashboard$"))
    page.wait_for_function("Number(document.body.dataset.refreshes) >= 1")
    timeline = page.locator("#chart-timeline")
    hover = timeline.locator(".hoverlayer .hovertext")

    # When carol hovers over its bar, then over its promotion
    for target in (timeline.locator(".barlayer .point path").first, timeline.locator(".scatterlayer .point").last):
        hover_over(page, target)
        hover.wait_for()

        # Then the hover shows the name as it was typed, and no bold or red text is made from it
        # (a long hover is wrapped into lines at spaces, which the lines' text no longer holds)
        shown = "".join(hover.locator("tspan.line").all_text_contents())
        assert re.sub(r"\s", "", f"#{job.pk} {MARKUP_NAME}") in re.sub(r"\s", "", shown), shown
        styles = hover.locator("tspan").evaluate_all("(spans) => spans.map((s) => s.getAttribute('style') || '')")
        assert not [s for s in styles if "bold" in s or "red" in s], styles
        page.mouse.move(0, 0)
        hover.wait_for(state="detached")
    assert timeline.locator("tspan[style*='bold']").count() == 0

    assert outside == [], f"the page reached for the internet: {outside}"
    assert errors == []
