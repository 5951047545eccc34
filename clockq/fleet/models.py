"""The host registry, drains, and the checkpoint folder's marker."""

from __future__ import annotations

from django.db import models


class Drainable(models.Model):
    """Drained for maintenance: takes no job until resumed (who, when, why)."""

    drained_at = models.DateTimeField(null=True, blank=True)
    drained_by = models.CharField(max_length=150, blank=True, default="")
    drain_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        abstract = True

    @property
    def drained(self) -> bool:
        return self.drained_at is not None


class Host(Drainable):
    """A machine that runs clockq roles, as its launcher (`manage.py runstack`) registers it and
    refreshes `seen_at` while it runs. A drained host's GPU workers take no job, those it starts
    later included."""

    name = models.CharField(max_length=63, unique=True)
    roles = models.JSONField(default=list, blank=True)
    # The broker it uses, as host:port without credentials, for operators and the start checks.
    broker = models.CharField(max_length=300, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class GpuWorker(Drainable):
    """A GPU worker name (gpu<N>@<host>), registered when its host's `gpuworkers` starts."""

    name = models.CharField(max_length=130, unique=True)
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpu_workers")
    gpu_index = models.IntegerField()
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host__name", "gpu_index"]
        verbose_name = "GPU worker"

    def __str__(self) -> str:
        return self.name


class CheckpointMarker(models.Model):
    """One row (pk 1): the token the web role wrote into CLOCKQ_CHECKPOINT_DIR. A host that
    reads the same token there sees the same folder as the web role."""

    SINGLETON = 1

    token = models.CharField(max_length=64)
    written_by = models.CharField(max_length=63)
    written_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"checkpoint marker by {self.written_by}"
