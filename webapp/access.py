"""Who may see which jobs: users their own, staff everything."""

from __future__ import annotations

from django.db.models import QuerySet

from clockq.jobs.models import Job


def visible_jobs(user) -> QuerySet[Job]:
    jobs = Job.objects.select_related("tier", "original_tier", "owner")
    return jobs if user.is_staff else jobs.filter(owner=user)
