"""Pages behind login: submit a job, list jobs, follow one job."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clockq.control_state import control
from clockq.jobs import metrics as job_metrics
from clockq.jobs import services
from webapp import client_input, job_page
from webapp.access import visible_jobs
from webapp.forms import WebJobForm, posted_fields
from webapp.results_api import result_file_response
from webapp.serializers import admission_note


@login_required
def job_list(request):
    page = Paginator(visible_jobs(request.user).order_by("-id"), 50).get_page(request.GET.get("page"))
    latest = job_metrics.latest([job.pk for job in page])
    for job in page:
        job.main_metric = main_metric(latest.get(job.pk, {}))
    return render(request, "webapp/job_list.html", {"page": page})


def main_metric(values: dict[str, float]) -> tuple[str, float] | None:
    """The metric a list shows: the loss if the job reports one, else its first by name."""
    if not values:
        return None
    name = "loss" if "loss" in values else min(values)
    return name, values[name]


@login_required
def job_new(request):
    form, refused = WebJobForm(user=request.user), None
    if request.method == "POST":
        try:
            form = WebJobForm(posted_fields(request), user=request.user)
        except client_input.InputRefused as exc:
            refused = str(exc)  # shown above an empty form: the post itself is not echoed back
    if form.is_valid():
        job = services.submit_job(owner=request.user, **form.submission())
        if job.held_for_admission:
            note = admission_note(control.admission())
            messages.warning(request, f"Job #{job.pk} submitted to {job.tier.code}. {note}")
        else:
            messages.success(request, f"Job #{job.pk} submitted to {job.tier.code}.")
        return redirect("job-detail", job_id=job.pk)
    gate = control.admission()
    closed = None if gate.admission_open else control.closed_note(gate)
    context = {
        "form": form,
        "refused": refused,
        "admission_closed": closed,
        "admission_holds": None if gate.admission_open else control.holding_note(gate),
    }
    return render(request, "webapp/job_new.html", context, status=400 if refused or form.errors else 200)


@login_required
def job_detail(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    return render(request, "webapp/job_detail.html", job_page.context(job, request.GET))


@login_required
@require_POST
def job_cancel(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    try:
        services.cancel_job(job, actor=request.user.get_username())
        messages.success(request, f"Job #{job.pk} cancelled.")
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    return redirect("job-detail", job_id=job.pk)


@login_required
def job_result_file(request, job_id: int, name: str):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    response = result_file_response(job, name)
    if response is None:
        raise Http404("No such result file.")
    return response
