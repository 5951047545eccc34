"""How large a job the cluster can run: the submit check of a job's `gpus` (clockq/policy/gangs.py
says why a size is refused)."""

from __future__ import annotations

from clockq.fleet.models import GpuWorker
from clockq.policy.gangs import size_problem

# The GPU workers of this version run each job on one GPU: they hold no gang together yet, so a
# job that asks for more is refused at submit, naming this limit, rather than left waiting for
# GPUs that would never start it together.
LARGEST_RUNNABLE = 1


def cluster_gpus() -> int:
    """The cluster's GPUs: its registered GPU workers, drained ones included (a drain ends)."""
    return GpuWorker.objects.count()


def gpus_problem(gpus: object) -> str | None:
    """Why a job may not ask for `gpus` GPUs on this cluster, or None."""
    if gpus == 1 and type(gpus) is int:
        return None  # every job of old: no query
    return size_problem(gpus, cluster_gpus=cluster_gpus(), largest_runnable=LARGEST_RUNNABLE)
