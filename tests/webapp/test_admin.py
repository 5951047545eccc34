"""The Django admin: job actions, validated add and edit, editable tiers."""

from __future__ import annotations

import pytest

from clockq.jobs.models import Job, QueueTier
from tests.helpers import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", "root-pass-123"))
    return client


def act(admin_client, action, *jobs):
    return admin_client.post("/admin/jobs/job/", {"action": action, "_selected_action": [j.pk for j in jobs]})


def test_hold_release_cancel_requeue(admin_client, alice):
    job = submit(alice)
    act(admin_client, "hold_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "held"
    act(admin_client, "release_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "queued"
    act(admin_client, "cancel_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    act(admin_client, "requeue_jobs", job)
    job.refresh_from_db()
    assert job.state == "queued" and job.finished_at is None
    reasons = list(job.events.values_list("reason", flat=True))
    assert reasons == ["submitted to SP", "held", "released", "cancelled", "requeued"]


def test_hold_on_a_running_job_waits_for_the_slice_boundary(admin_client, alice):
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(state="running")
    act(admin_client, "hold_jobs", job)
    job.refresh_from_db()
    assert job.state == "running" and job.pending_action == "hold"


def test_an_action_that_does_not_apply_is_reported_not_applied(admin_client, alice):
    job = submit(alice)
    response = act(admin_client, "release_jobs", job)
    assert Job.objects.get(pk=job.pk).state == "queued"
    assert response.status_code == 302


def test_the_job_page_shows_slices_and_events(admin_client, alice):
    job = submit(alice, name="visible")
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "visible" in page and "submitted to SP" in page


def test_filters_and_search(admin_client, alice):
    submit(alice, "RT", name="needle")
    submit(alice, "BK", name="hay")
    page = admin_client.get("/admin/jobs/job/?q=needle").content.decode()
    assert "needle" in page and ">hay<" not in page
    assert admin_client.get("/admin/jobs/job/?state__exact=queued&tier__id__exact=1").status_code == 200
    submit(alice, "BK", name="crunch", workload="matmul", size=8, steps=1)
    by_workload = admin_client.get("/admin/jobs/job/?workload=matmul").content.decode()
    assert "crunch" in by_workload and "needle" not in by_workload


def test_adding_a_job_in_the_admin_validates_and_dispatches(admin_client, alice):
    data = {"owner": alice.pk, "name": "from-admin", "tier": "HP", "workload": "synthetic", "params": '{"steps": 0}'}
    bad = admin_client.post("/admin/jobs/job/add/", data)
    assert bad.status_code == 200 and "steps: must be between" in bad.content.decode()
    assert Job.objects.count() == 0
    good = admin_client.post("/admin/jobs/job/add/", {**data, "params": '{"steps": 5}'})
    assert good.status_code == 302
    job = Job.objects.get()
    assert (job.state, job.tier.code, job.params["steps"]) == ("queued", "HP", 5)
    assert job.owner == alice and job.events.get().actor == "root"


def test_the_admin_add_form_has_the_submit_forms_limits(admin_client, alice):
    """The admin goes through the same form as the web page and the API, size limit included."""
    huge = '{"steps": 5, "padding": "' + "x" * 17_000 + '"}'
    data = {"owner": alice.pk, "name": "big", "tier": "SP", "workload": "synthetic", "params": huge}
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200 and "at most 16384 bytes" in response.content.decode()
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 32"),
        ('{"\\ud800": 1}', "has a key that holds text that cannot be stored"),
        ('{"steps": 1, "steps": 2}', "holds the key &#x27;steps&#x27; more than once"),
    ],
)
def test_the_admin_add_form_reads_params_as_the_api_does(admin_client, alice, params, error):
    data = {"owner": alice.pk, "name": "bad", "tier": "SP", "workload": "synthetic", "params": params}
    response = admin_client.post("/admin/jobs/job/add/", data)
    assert response.status_code == 200 and error in response.content.decode()
    assert Job.objects.count() == 0


def test_staff_may_add_a_command_job_in_the_admin(admin_client, alice):
    data = {"owner": alice.pk, "name": "script", "tier": "SP", "workload": "command", "params": '{"argv": ["true"]}'}
    assert admin_client.post("/admin/jobs/job/add/", data).status_code == 302
    assert Job.objects.get().workload == "command"


def test_editing_a_job_keeps_state_and_validates_the_deadline(admin_client, alice):
    job = submit(alice, name="old")
    bad = admin_client.post(
        f"/admin/jobs/job/{job.pk}/change/",
        {
            "name": "new",
            "deadline_0": "2001-01-01",
            "deadline_1": "00:00:00",
            "slices-TOTAL_FORMS": 0,
            "slices-INITIAL_FORMS": 0,
            "events-TOTAL_FORMS": 0,
            "events-INITIAL_FORMS": 0,
        },
    )
    assert "must be in the future" in bad.content.decode()
    assert Job.objects.get(pk=job.pk).name == "old"


def tier_form(tier, **changes):
    """The tier's change form as the admin posts it, with `changes`."""
    fields = ["use", "wait_target_ms", "start_timeout_ms", "base_slice_ms", "min_slice_ms"]
    fields += ["promote_after_rounds", "chance_jobs"]
    data = {f: getattr(tier, f) for f in fields} | {"promote_to": tier.promote_to_id, "chance_to": tier.chance_to_id}
    data |= changes
    return {k: "" if v is None else v for k, v in data.items()}


def test_tiers_are_editable_and_checked(admin_client):
    sp = QueueTier.objects.get(code="SP")
    url = f"/admin/jobs/queuetier/{sp.pk}/change/"
    bad = admin_client.post(url, tier_form(sp, base_slice_ms=10, min_slice_ms=20))
    assert "cannot exceed the base slice" in bad.content.decode()
    admin_client.post(url, tier_form(sp, base_slice_ms=100, min_slice_ms=20))
    assert QueueTier.objects.get(code="SP").base_slice_ms == 100


def tiers():
    return {t.code: t for t in QueueTier.objects.all()}


@pytest.mark.parametrize(
    ("tier", "changes", "error"),
    [
        ("HP", lambda t: {"promote_after_rounds": 3, "promote_to": t["SP"].pk}, "HP -&gt; SP: jobs may only be lifted"),
        ("HP", lambda t: {"promote_after_rounds": 3, "promote_to": t["SP"].pk}, "would loop"),
        ("SP", lambda t: {"promote_to": t["SP"].pk}, "cannot be lifted to itself"),
        ("SP", lambda t: {"promote_to": 999}, "Select a valid choice"),
        ("SP", lambda t: {"promote_after_rounds": -1}, "greater than or equal to"),
        ("SP", lambda t: {"promote_after_rounds": ""}, "say after how many skipped rounds"),
        ("BP", lambda t: {"chance_to": t["BK"].pk}, "BP -&gt; BK"),
        ("BP", lambda t: {"chance_to": ""}, "choose the tier whose queue"),
        ("BP", lambda t: {"chance_jobs": -2}, "greater than or equal to"),
        ("RT", lambda t: {"start_timeout_ms": 0}, "greater than or equal to 1"),
    ],
)
def test_a_bad_tier_edit_is_refused_and_changes_nothing(admin_client, tier, changes, error):
    before = list(QueueTier.objects.order_by("pk").values())
    row = tiers()[tier]
    page = admin_client.post(f"/admin/jobs/queuetier/{row.pk}/change/", tier_form(row, **changes(tiers())))
    assert page.status_code == 200  # the form again, with the error
    assert error in page.content.decode()
    assert list(QueueTier.objects.order_by("pk").values()) == before


def test_promotion_settings_are_editable(admin_client):
    t = tiers()
    admin_client.post(
        f"/admin/jobs/queuetier/{t['BK'].pk}/change/", tier_form(t["BK"], promote_after_rounds=5, promote_to=t["BP"].pk)
    )
    bk = QueueTier.objects.get(code="BK")
    assert (bk.promote_after_rounds, bk.promote_to.code) == (5, "BP")
    assert admin_client.get("/admin/jobs/queuetier/").status_code == 200


def test_the_periodic_tasks_are_seeded_and_a_bad_interval_is_refused(admin_client):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    names = set(PeriodicTask.objects.values_list("name", flat=True))
    for name in ("promotion tick", "batch chance BP", "SLO check", "KPI rollup"):
        assert f"clockq: {name}" in names
    tick = PeriodicTask.objects.get(name="clockq: promotion tick")
    assert (tick.interval.every, tick.interval.period, tick.queue) == (10, "seconds", "control")
    assert PeriodicTask.objects.get(name="clockq: batch chance BP").interval.every == 7200

    page = admin_client.post("/admin/django_celery_beat/intervalschedule/add/", {"every": -5, "period": "seconds"})
    assert "greater than or equal to 1" in page.content.decode()
    assert not IntervalSchedule.objects.filter(every=-5).exists()


def test_staff_promote_jobs_from_the_admin(admin_client, alice):
    waiting, running = submit(alice, "SP", "waiting"), submit(alice, "SP", "running")
    Job.objects.filter(pk=running.pk).update(state="running")
    page = admin_client.post(
        "/admin/jobs/job/", {"action": "promote_jobs", "_selected_action": [waiting.pk, running.pk]}, follow=True
    )
    assert Job.objects.get(pk=waiting.pk).tier.code == "HP"
    assert Job.objects.get(pk=running.pk).tier.code == "SP"
    assert "Promoted 1 job(s)." in page.content.decode()
    assert f"Only a waiting job can be promoted; job #{running.pk} is running" in page.content.decode()


def test_the_job_page_shows_placement_and_telemetry(admin_client, alice):
    job = submit(alice, name="placed")
    Job.objects.filter(pk=job.pk).update(placement_note="needs 90000 MiB of GPU memory", util_ewma=0.42)
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "needs 90000 MiB of GPU memory" in page and "0.42" in page


def test_the_admin_shows_a_jobs_result(admin_client, alice):
    job = submit(alice, name="with-result")
    Job.objects.filter(pk=job.pk).update(
        state="succeeded", result_bytes=2048, result_files=[{"name": "model.keras", "bytes": 2048, "sha256": "ab" * 32}]
    )
    page = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()
    assert "2.0\xa0KB" in page and "model.keras" in page


@pytest.mark.django_db
@pytest.mark.parametrize("model", ["metricsample", "modelversion", "forecast"])
def test_the_predictors_records_are_listed_read_only(admin_client, model):
    assert admin_client.get(f"/admin/forecasting/{model}/").status_code == 200
    assert admin_client.get(f"/admin/forecasting/{model}/add/").status_code == 403
