"""Pages behind login: submit a job, list jobs, follow one job."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from clockq.jobs import services
from webapp.access import visible_jobs
from webapp.forms import JobSubmitForm
from webapp.results_api import result_file_response


@login_required
def job_list(request):
    page = Paginator(visible_jobs(request.user).order_by("-id"), 50).get_page(request.GET.get("page"))
    return render(request, "webapp/job_list.html", {"page": page})


@login_required
def job_new(request):
    form = JobSubmitForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        job = services.submit_job(owner=request.user, **form.submission())
        messages.success(request, f"Job #{job.pk} submitted to {job.tier.code}.")
        return redirect("job-detail", job_id=job.pk)
    return render(request, "webapp/job_new.html", {"form": form}, status=400 if form.errors else 200)


@login_required
def job_detail(request, job_id: int):
    job = get_object_or_404(visible_jobs(request.user), pk=job_id)
    return render(
        request,
        "webapp/job_detail.html",
        {
            "job": job,
            "slices": job.slices.order_by("-started_at", "-id")[:200],
            "events": job.events.order_by("-at", "-id")[:100],
        },
    )


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
