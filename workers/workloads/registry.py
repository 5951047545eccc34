"""Build the workload a job names. Only names in settings.CLOCKQ_WORKLOADS may run; their
params schemas are in the core (clockq.jobs.workloads), their classes here."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from clockq.jobs import workloads
from workers.workloads.base import Workload


@cache
def workload_class(name: str) -> type[Workload]:
    workloads.spec(name)  # UnknownWorkload unless it is enabled
    return import_string(settings.CLOCKQ_WORKLOADS[name])


def create(name: str, params: dict[str, Any]) -> Workload:
    """A fresh workload for a job. Params are validated again: the row may predate a schema change."""
    return workload_class(name)(workloads.validate(name, params, may_run_commands=True))
