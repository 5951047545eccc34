"""The control state against the real database: apply_forecast and its audit rows, the operator's
override, admission at submission, and the release of held jobs when admission reopens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clockq.bus import dispatch
from clockq.control_state import control
from clockq.control_state.models import ControlDecision, ControlState
from clockq.jobs import admission, services
from clockq.jobs.models import Job
from clockq.policy import control as rules
from tests.helpers import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch, django_capture_on_commit_callbacks):
    """The dispatch messages sent, as (job id, queue), with on-commit callbacks run."""
    messages: list[tuple[int, str]] = []
    monkeypatch.setattr(
        dispatch, "send_run_slice", lambda job_id, _token, queue, **_kw: messages.append((job_id, queue))
    )
    return messages


def committed(django_capture_on_commit_callbacks):
    return django_capture_on_commit_callbacks(execute=True)


def state() -> ControlState:
    return ControlState.objects.get(pk=ControlState.SINGLETON)


def audit(what: str | None = None):
    rows = ControlDecision.objects.order_by("id")
    return list(rows.filter(what=what) if what else rows)


def test_admission_is_open_before_any_forecast_and_reading_it_writes_nothing():
    assert control.admission_open() is True
    assert not ControlState.objects.exists()
    s = control.control_state()
    assert (s.pk, s.admission_open, s.prefetch_on, s.desired_workers, s.forced) == (1, True, False, None, False)
    assert control.control_state().pk == 1 and ControlState.objects.count() == 1


def test_apply_forecast_writes_the_changes_with_an_audit_row_each():
    at = timezone.now()
    changes = control.apply_forecast(0.91, at, workers=4)

    assert [(d.field, d.old, d.new) for d in changes] == [("admission_open", True, False), ("desired_workers", None, 6)]
    s = state()
    assert (s.admission_open, s.prefetch_on, s.desired_workers, s.forecast, s.forecast_at) == (
        False,
        False,
        6,
        0.91,
        at,
    )
    assert s.reason.startswith("admission closed: forecast 91% > 85%; prefetch off")
    rows = audit()
    assert [(r.what, r.old, r.new, r.actor, r.forecast) for r in rows] == [
        ("admission_open", "true", "false", "controller", 0.91),
        ("desired_workers", "", "6", "controller", 0.91),
    ]
    assert rows[0].reason == "admission closed: forecast 91% > 85%"

    # The same forecast again changes nothing and writes no row.
    assert control.apply_forecast(0.91, at + timedelta(minutes=1), workers=4) == []
    assert len(audit()) == 2


def test_an_older_forecast_arriving_late_is_ignored():
    now = timezone.now()
    control.apply_forecast(0.9, now, workers=1)
    assert control.apply_forecast(0.1, now - timedelta(minutes=1), workers=1) == []
    assert (state().admission_open, state().forecast) == (False, 0.9)


def test_a_bad_forecast_is_refused_and_changes_nothing():
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="forecast"):
            control.apply_forecast(bad, workers=1)
    assert not ControlDecision.objects.exists()


def test_a_forecast_oscillating_around_85_changes_admission_once():
    at = timezone.now()
    series = [0.84, 0.86] * 10 + [0.76, 0.9, 0.8, 0.88, 0.77, 0.89, 0.84, 0.86]
    for i, f in enumerate(series):
        control.apply_forecast(f, at + timedelta(minutes=i), workers=2)
    assert [(r.old, r.new) for r in audit("admission_open")] == [("true", "false")]
    assert state().admission_open is False


def test_prefetch_follows_the_forecast():
    at = timezone.now()
    control.apply_forecast(0.2, at, workers=1)
    assert state().prefetch_on is True
    control.apply_forecast(0.33, at + timedelta(minutes=1), workers=1)
    assert state().prefetch_on is True  # inside the band
    control.apply_forecast(0.5, at + timedelta(minutes=2), workers=1)
    assert state().prefetch_on is False
    assert [(r.old, r.new) for r in audit("prefetch_on")] == [("false", "true"), ("true", "false")]


def test_a_forced_state_is_not_changed_by_the_controller():
    control.force_state(actor="oscar", admission_open=False, prefetch_on=True, desired_workers=3, note="maintenance")
    before = audit()
    assert [(r.what, r.new, r.actor) for r in before] == [
        ("forced", "true", "oscar"),
        ("admission_open", "false", "oscar"),
        ("prefetch_on", "true", "oscar"),
        ("desired_workers", "3", "oscar"),
    ]
    assert before[1].reason == "forced by oscar: maintenance"

    at = timezone.now()
    assert control.apply_forecast(0.05, at, workers=8) == []
    s = state()
    assert (s.admission_open, s.prefetch_on, s.desired_workers, s.forced, s.forced_by) == (
        False,
        True,
        3,
        True,
        "oscar",
    )
    assert (s.forecast, s.forecast_at) == (0.05, at)  # the forecast is still recorded
    assert audit() == before

    # Cleared: the next forecast decides again.
    assert [(d.field, d.new) for d in control.unforce("oscar")] == [("forced", False)]
    control.apply_forecast(0.05, at + timedelta(minutes=1), workers=8)
    assert state().admission_open is True
    assert audit("admission_open")[-1].actor == "controller"
    assert audit("forced")[-1].new == "false"


def test_bad_override_input_is_refused_and_changes_nothing():
    for bad in (-1, 10**9, "3", True):
        with pytest.raises(control.ControlRefused):
            control.force_state(actor="oscar", desired_workers=bad)
    assert not ControlDecision.objects.exists()
    assert control.admission_open() is True


@pytest.fixture
def full(alice, sent, django_capture_on_commit_callbacks):
    """One GPU, held by a running HP job, and a new HP job queued for it; then a forecast of 91%
    closes admission. The cluster is full for a new job of any tier below HP."""
    with committed(django_capture_on_commit_callbacks):
        running = submit(alice, "HP", "running")
        queued = submit(alice, "HP", "queued")
    Job.objects.filter(pk=running.pk).update(state="running")
    control.apply_forecast(0.91, workers=1)
    sent.clear()
    return running, queued


FULL_NOTE = (
    "held: admission closed (forecast 91% > 85%); the cluster is full for it: no GPU is free, and new work of "
    "more urgent tiers already waits for 1 GPU(s) (the cluster has 1); it is queued at the first forecast at "
    "which it would start, or when admission reopens"
)


def test_a_closed_admission_holds_a_new_job_that_would_wait_anyway_without_a_message(
    alice, full, sent, django_capture_on_commit_callbacks
):
    with committed(django_capture_on_commit_callbacks):
        job = submit(alice, "SP", "waits")
        hp = submit(alice, "HP", "fine-tune")  # nothing more urgent waits: it is next in line
        rt = submit(alice, "RT", "inference")

    job.refresh_from_db()
    assert (job.state, job.held_for_admission, job.enqueued_at) == ("held", True, None)
    event = job.events.get()
    assert (event.from_state, event.to_state) == ("", "held")
    assert event.reason == f"submitted to SP; {FULL_NOTE}"
    assert [(j.state, j.held_for_admission) for j in (hp, rt)] == [("queued", False)] * 2
    assert sent == [(hp.pk, "hp"), (rt.pk, "rt")]


def test_a_closed_admission_queues_a_new_job_while_a_gpu_is_free(alice, sent, django_capture_on_commit_callbacks):
    control.apply_forecast(0.91, workers=2)
    with committed(django_capture_on_commit_callbacks):
        job = submit(alice, "BK", "experiment")
    assert (job.state, job.held_for_admission) == ("queued", False) and sent == [(job.pk, "bk")]


def test_a_forecast_that_keeps_admission_closed_queues_the_held_jobs_that_would_now_start(
    alice, full, sent, django_capture_on_commit_callbacks
):
    running, _ = full
    with committed(django_capture_on_commit_callbacks):
        bk, sp = submit(alice, "BK", "experiment"), submit(alice, "SP", "train")
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.9, workers=1)  # still closed, still full
    assert [Job.objects.get(pk=j.pk).state for j in (bk, sp)] == ["held", "held"] and sent == []

    Job.objects.filter(pk=running.pk).update(state="succeeded")  # its GPU is free
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.9, workers=1)

    assert state().admission_open is False
    assert sent == [(sp.pk, "sp"), (bk.pk, "bk")]  # the most urgent tier first
    for job in (sp, bk):
        job.refresh_from_db()
        assert (job.state, job.held_for_admission) == ("queued", False)
        assert job.events.order_by("id").last().reason == "released: it would start now: a GPU is free"


def test_with_holds_all_a_closed_admission_holds_every_new_job_but_rt_until_it_reopens(
    alice, sent, settings, django_capture_on_commit_callbacks
):
    settings.CLOCKQ_ADMISSION_HOLDS = "all"
    at = timezone.now()
    control.apply_forecast(0.91, at, workers=4)  # GPUs free, yet held: the literal pause
    with committed(django_capture_on_commit_callbacks):
        job, rt = submit(alice, "SP", "waits"), submit(alice, "RT", "inference")
    assert job.events.get().reason == (
        "submitted to SP; held: admission closed (forecast 91% > 85%); it is queued when admission reopens"
    )
    assert (job.state, rt.state, sent) == ("held", "queued", [(rt.pk, "rt")])
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.8, at + timedelta(minutes=1), workers=4)
    assert Job.objects.get(pk=job.pk).state == "held"
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.6, at + timedelta(minutes=2), workers=4)
    assert Job.objects.get(pk=job.pk).state == "queued" and sent[-1] == (job.pk, "sp")


def test_reopening_releases_held_jobs_by_tier_then_age_and_leaves_operator_holds(
    alice, sent, django_capture_on_commit_callbacks
):
    control.force_state(actor="oscar", admission_open=False)
    old = timezone.now() - timedelta(hours=1)
    jobs = {}
    with committed(django_capture_on_commit_callbacks):
        for name, tier in [("bk", "BK"), ("sp-new", "SP"), ("hp", "HP"), ("sp-old", "SP")]:
            jobs[name] = submit(alice, tier, name)
        Job.objects.filter(pk=jobs["sp-old"].pk).update(submitted_at=old)
    assert all(Job.objects.get(pk=j.pk).held_for_admission for j in jobs.values())
    # An operator's hold is not an admission hold.
    ControlState.objects.filter(pk=1).update(admission_open=True)
    with committed(django_capture_on_commit_callbacks):
        operator_held = submit(alice, "HP", "operator-held")
        services.hold_job(operator_held, actor="oscar")
    ControlState.objects.filter(pk=1).update(admission_open=False)
    sent.clear()

    with committed(django_capture_on_commit_callbacks):
        control.force_state(actor="oscar", admission_open=True)

    order = [jobs[n].pk for n in ("hp", "sp-old", "sp-new", "bk")]
    assert [job_id for job_id, _ in sent] == order
    assert [queue for _, queue in sent] == ["hp", "sp", "sp", "bk"]
    for job in Job.objects.filter(pk__in=order):
        assert (job.state, job.held_for_admission) == ("queued", False)
        last = job.events.order_by("id").last()
        assert (last.from_state, last.to_state, last.actor) == ("held", "queued", "oscar")
        assert last.reason == "released: admission reopened by oscar"
    operator_held.refresh_from_db()
    assert (operator_held.state, operator_held.held_for_admission) == ("held", False)

    # Idempotent: nothing is left to release, and nothing is sent twice.
    assert admission.release_held_for_admission("controller", "again") == 0


def test_the_controller_reopening_releases_the_held_jobs(alice, full, sent, django_capture_on_commit_callbacks):
    at = timezone.now()
    with committed(django_capture_on_commit_callbacks):
        job = submit(alice, "BP", "batch")
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.8, at + timedelta(minutes=1), workers=1)  # still closed, still full
    assert Job.objects.get(pk=job.pk).state == "held" and sent == []
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.6, at + timedelta(minutes=2), workers=1)
    job.refresh_from_db()
    assert job.state == "queued" and sent == [(job.pk, "bp")]
    assert job.events.order_by("id").last().reason == "released: admission reopened: forecast 60% < 75%"


def test_a_held_for_admission_job_that_leaves_held_loses_the_mark(alice, django_capture_on_commit_callbacks):
    control.force_state(actor="oscar", admission_open=False)
    job = submit(alice, "SP", "x")
    services.cancel_job(job, actor="alice")
    job.refresh_from_db()
    assert (job.state, job.held_for_admission) == ("cancelled", False)
    # Requeued by an operator while admission is closed, then held by one: still an operator hold.
    services.requeue_job(job, actor="oscar")
    services.hold_job(job, actor="oscar")
    control.unforce("oscar")
    with committed(django_capture_on_commit_callbacks):
        control.force_state(actor="oscar", admission_open=True)
    assert Job.objects.get(pk=job.pk).state == "held"


def test_a_submission_racing_the_reopening_is_released_once_committed(alice, sent, django_capture_on_commit_callbacks):
    """Admission reopens between the submission's read and its commit: the release sweep ran
    before the job existed, so the submission releases it itself."""
    control.force_state(actor="oscar", admission_open=False)
    original = control.admission

    def read_then_reopen():
        seen = original()
        ControlState.objects.filter(pk=1).update(admission_open=True)  # reopened meanwhile
        return seen

    control.admission = read_then_reopen  # type: ignore[assignment]
    try:
        with committed(django_capture_on_commit_callbacks):
            job = submit(alice, "SP", "racer")
    finally:
        control.admission = original  # type: ignore[assignment]
    job.refresh_from_db()
    assert job.state == "queued" and sent == [(job.pk, "sp")]


def test_the_controller_picks_up_a_straggler_while_admission_is_open(alice, sent, django_capture_on_commit_callbacks):
    """A held-for-admission job found while admission is open (a submission that lost the race
    and whose own release failed) is released by the next forecast."""
    control.force_state(actor="oscar", admission_open=False)
    job = submit(alice, "SP", "straggler")  # its on-commit release never runs here
    control.unforce("oscar")
    ControlState.objects.filter(pk=1).update(admission_open=True)
    with committed(django_capture_on_commit_callbacks):
        control.apply_forecast(0.5, workers=1)
    assert Job.objects.get(pk=job.pk).state == "queued" and sent == [(job.pk, "sp")]


def test_the_cluster_is_weighed_from_the_running_jobs_and_the_queued_ones_by_class(alice, sent):
    running = submit(alice, "SP", "running")
    Job.objects.filter(pk=running.pk).update(state="running")
    new_hp = [submit(alice, "HP", f"new-{i}") for i in range(2)]
    served = submit(alice, "HP", "served")
    Job.objects.filter(pk=served.pk).update(run_ms=600_000)  # past HP's first rung: a level above 0
    submit(alice, "BK", "experiment")

    # A GPU is free: the queue does not matter, and is not read.
    assert admission.cluster(2) == rules.Cluster(gpus=2, free_gpus=1, queued=())
    full = admission.cluster(1)
    classes = sorted((s.rank, s.level > 0, s.promoted, s.gpus) for s in full.queued)
    assert classes == [(1, False, False, 2), (1, True, False, 1), (4, False, False, 1)]
    assert [full.room(rank).gpus_ahead for rank in range(5)] == [0, 0, 2, 2, 2]
    assert full.room(2).full and not full.room(1).full
    assert new_hp  # the two new HP jobs are the work ahead of a new SP job


def test_a_batchs_earlier_entries_count_ahead_of_its_later_ones(alice, sent, django_capture_on_commit_callbacks):
    running = submit(alice, "SP", "running")
    Job.objects.filter(pk=running.pk).update(state="running")
    control.apply_forecast(0.91, workers=1)  # one GPU, busy; nothing waits
    entry = {"workload": "synthetic", "params": {"steps": 10}, "deadline": None, "gpu_mem_mib": None}
    batch = [{**entry, "name": "ft", "tier_code": "HP"}, {**entry, "name": "train", "tier_code": "SP"}]
    with committed(django_capture_on_commit_callbacks):
        hp, sp = services.submit_jobs(alice, batch)
    # The HP job is next in line; the SP job would wait behind it for the only GPU.
    assert [(j.state, j.held_for_admission) for j in (hp, sp)] == [("queued", False), ("held", True)]
