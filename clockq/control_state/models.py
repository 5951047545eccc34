"""The control state: what the load forecast (or an operator) decided, and its audit trail."""

from __future__ import annotations

from django.db import models


class ControlState(models.Model):
    """One row (pk 1): what the load forecast decided (clockq/policy/control.py), or what an
    operator forced. Read on every submission, so it stays one small row."""

    SINGLETON = 1

    admission_open = models.BooleanField(default=True)
    prefetch_on = models.BooleanField(default=False)
    desired_workers = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no forecast yet.")
    reason = models.TextField(blank=True, default="")
    forecast = models.FloatField(null=True, blank=True, help_text="The latest forecast load index.")
    forecast_at = models.DateTimeField(null=True, blank=True)
    # The GPU workers alive at that forecast: what a closed admission weighs a new job's room
    # against (clockq/policy/control.py, Room).
    gpus = models.PositiveIntegerField(null=True, blank=True, help_text="GPU workers alive at the latest forecast.")
    # An operator's override: the controller records forecasts but changes nothing while it holds.
    forced = models.BooleanField(default=False)
    forced_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "jobs_controlstate"  # the table it had in clockq.jobs
        verbose_name = "control state"
        verbose_name_plural = "control state"

    def __str__(self) -> str:
        admission = "open" if self.admission_open else "closed"
        return f"admission {admission}, prefetch {'on' if self.prefetch_on else 'off'}"


class ControlDecision(models.Model):
    """The audit trail of the control state: one row per changed value, by the controller or an
    operator."""

    at = models.DateTimeField(auto_now_add=True)
    what = models.CharField(max_length=30, help_text="admission_open, prefetch_on, desired_workers or forced.")
    old = models.CharField(max_length=30, blank=True, default="")
    new = models.CharField(max_length=30, blank=True, default="")
    reason = models.TextField()
    forecast = models.FloatField(null=True, blank=True)
    actor = models.CharField(max_length=200, help_text='"controller", or the operator.')

    class Meta:
        db_table = "jobs_controldecision"  # the table it had in clockq.jobs
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.what}: {self.old} -> {self.new} by {self.actor}"
