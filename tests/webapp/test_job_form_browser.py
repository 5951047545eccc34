"""The submit form in a real browser (headless Chromium, the Debian package, driven by Playwright):
choosing a workload shows its fields without a reload, a job submitted through the fields
appears, and a refused value is named next to its field. A screenshot of the form for each
workload is kept in var/screenshots/. Skipped, saying why, where /usr/bin/chromium is missing."""

from __future__ import annotations

import re

import pytest

from clockq.jobs import workloads
from clockq.jobs.models import Job
from tests.browser import TIMEOUT_MS, log_in
from tests.harness import ROOT

pytestmark = pytest.mark.django_db(transaction=True)  # the live server needs committed rows

SCREENSHOTS = ROOT / "var" / "screenshots"
# A fieldset of at most six params, and the form around it: a page a user reads without scrolling far.
MAX_FORM_HEIGHT_PX = 2_400


def new_page(browser, live_server, **options):
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900}, **options)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))  # the script's errors
    return context, page, errors


@pytest.fixture
def page_and_errors(browser, live_server, transactional_db):
    context, page, errors = new_page(browser, live_server)
    yield page, errors
    context.close()


def fieldset(page, workload: str):
    return page.locator(f"fieldset[data-workload={workload}]")


def field_group(page, name: str):
    """The block that holds a field: its label, help, errors and control."""
    return page.locator("#job-form .field", has=page.locator(f"[name={name}]"))


def test_choosing_each_workload_shows_its_fields_without_a_reload(page_and_errors, operator):
    page, errors = page_and_errors
    log_in(page, "/accounts/login/?next=/jobs/new", "oscar", "oscar-pass-123")
    page.wait_for_url(re.compile(r"/jobs/new$"))
    assert page.get_by_label("Workload").input_value() == "keras_train"  # the first one offered
    page.evaluate("window.sameDocument = true")  # gone if the page were loaded again
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    for workload in workloads.available():
        page.get_by_label("Workload").select_option(workload)
        params = list(workloads.spec(workload).params)
        shown = page.locator("fieldset[data-workload]:visible")
        assert shown.count() == 1 and shown.get_attribute("data-workload") == workload
        names = shown.locator("input, textarea").evaluate_all("els => els.map(e => e.name)")
        assert names == [f"{workload}__{key}" for key in params]
        for key in params:  # each labelled with its name, its help and bounds beside it
            assert shown.get_by_label(key, exact=False).first.is_visible()
        assert page.evaluate("window.sameDocument") is True
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height <= MAX_FORM_HEIGHT_PX, f"{workload}: the form is {height} px tall"
        page.screenshot(path=str(SCREENSHOTS / f"job_form_{workload}.png"), full_page=True)

    # Filling the JSON box says that it is used instead of the fields
    page.locator("#params-json summary").click()
    note = page.locator("#params-json-note")
    assert note.is_hidden()
    page.get_by_label("Params as JSON").fill('{"argv": ["true"]}')
    assert note.is_visible() and "overridden" in fieldset(page, "command").get_attribute("class")
    assert errors == []


def test_a_job_submitted_through_the_fields_appears(page_and_errors, alice):
    page, errors = page_and_errors
    log_in(page, "/accounts/login/?next=/jobs/new", "alice", "alice-pass-123")
    page.get_by_label("Name").fill("first-keras")
    keras = fieldset(page, "keras_train")
    keras.get_by_label("steps").fill("50")
    keras.get_by_label("learning_rate").fill("0.01")
    page.get_by_role("button", name="Submit").click()

    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get()
    assert page.get_by_role("heading", level=1).inner_text() == f"Job #{job.pk}: first-keras"
    assert (job.workload, job.params["steps"], job.params["learning_rate"]) == ("keras_train", 50, 0.01)
    assert job.params["batch_size"] == 64  # untouched: its default
    assert errors == []


def test_an_out_of_range_value_is_named_next_to_its_field(page_and_errors, alice):
    page, errors = page_and_errors
    log_in(page, "/accounts/login/?next=/jobs/new", "alice", "alice-pass-123")
    page.get_by_label("Name").fill("too-big")
    page.get_by_label("Workload").select_option("matmul")
    fieldset(page, "matmul").get_by_label("size").fill("99999")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_load_state()

    size = field_group(page, "matmul__size")
    assert size.locator(".errorlist").inner_text() == "size must be between 2 and 4096."
    assert size.locator(".errorlist").is_visible()  # the chosen workload's fields are shown again
    assert page.locator(".errorlist:visible").count() == 1  # one error, by its field, none elsewhere
    assert fieldset(page, "matmul").get_by_label("size").input_value() == "99999"
    assert page.get_by_label("Name").input_value() == "too-big"
    assert Job.objects.count() == 0
    assert errors == []


def test_text_a_number_field_cannot_read_is_named_there_and_not_posted(page_and_errors, alice):
    page, errors = page_and_errors
    log_in(page, "/accounts/login/?next=/jobs/new", "alice", "alice-pass-123")
    page.get_by_label("Name").fill("typo")
    steps = fieldset(page, "keras_train").get_by_label("steps")
    steps.fill("")
    steps.press_sequentially("1e")  # a number input posts nothing for this: the default would be used
    page.evaluate("window.sameDocument = true")
    page.get_by_role("button", name="Submit").click()

    error = field_group(page, "keras_train__steps").locator(".errorlist.unreadable")
    error.wait_for()
    assert error.inner_text() == "steps must be a number."
    assert page.evaluate("window.sameDocument") is True and Job.objects.count() == 0
    assert errors == []


def test_without_javascript_every_workloads_fields_show_and_the_chosen_ones_are_read(browser, live_server, alice):
    context, page, _ = new_page(browser, live_server, java_script_enabled=False)
    try:
        log_in(page, "/accounts/login/?next=/jobs/new", "alice", "alice-pass-123")
        visible = page.locator("fieldset[data-workload]:visible")
        assert visible.count() == 3  # all but command, which alice may not run
        page.get_by_label("Name").fill("no-script")
        page.get_by_label("Workload").select_option("matmul")
        fieldset(page, "matmul").get_by_label("steps").fill("7")
        fieldset(page, "synthetic").get_by_label("steps").fill("0")  # another workload's: not read
        page.get_by_role("button", name="Submit").click()
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        assert Job.objects.get().params == {"size": 256, "steps": 7}
    finally:
        context.close()
