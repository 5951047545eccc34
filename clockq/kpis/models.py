"""The KPI rollups: what the KPIs add up per minute and hour, per tier and per GPU worker."""

from __future__ import annotations

from django.db import models

from clockq.jobs.models import QueueTier


def _empty_wait_counts() -> list[int]:
    from clockq.policy.kpis import WAIT_BUCKETS_MS

    return [0] * (len(WAIT_BUCKETS_MS) + 1)


class KpiFacts(models.Model):
    """What the KPIs add up for one tier over one period (the job's own tier, promoted or not)."""

    tier = models.ForeignKey(QueueTier, on_delete=models.CASCADE, related_name="+")
    queue_depth = models.PositiveIntegerField(
        default=0, help_text="Jobs queued when the rollup sampled it (an hour: its deepest sample)."
    )
    # Jobs whose first start fell in the period, and their waits from submission.
    started = models.PositiveIntegerField(default=0)
    wait_ms_sum = models.BigIntegerField(default=0)
    wait_counts = models.JSONField(default=_empty_wait_counts, help_text="Per WAIT_BUCKETS_MS bucket, then longer.")
    # Jobs that ended in the period.
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    timed_out = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    on_time = models.PositiveIntegerField(default=0)
    late = models.PositiveIntegerField(default=0, help_text="Jobs marked late in the period.")
    promotions = models.PositiveIntegerField(default=0, help_text="Promotions and batch chances.")
    # Slices that ended in the period.
    slices = models.PositiveIntegerField(default=0)
    slice_outcomes = models.JSONField(default=dict, help_text="Outcome -> count.")
    busy_ms = models.BigIntegerField(default=0, help_text="GPU time the slices held.")
    useful_ms = models.BigIntegerField(default=0, help_text="GPU time whose work was kept (not failed or lost).")
    util_ms = models.FloatField(default=0.0, help_text="Sum of used_ms x measured GPU utilisation.")
    switches = models.PositiveIntegerField(default=0)
    switch_ms_sum = models.FloatField(default=0.0, help_text="Checkpoint plus restore time of the switches.")

    class Meta:
        abstract = True


class KpiMinute(KpiFacts):
    """Per minute and tier. Filled by the KPI rollup periodic task (clockq/kpis/rollup.py), so
    /api/kpis and the dashboard never scan every Slice. A minute's row is recomputed while late
    data can still arrive."""

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")

    class Meta:
        db_table = "jobs_kpiminute"  # the table it had in clockq.jobs
        constraints = [models.UniqueConstraint(fields=["minute", "tier"], name="kpi_minute_tier")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"KPIs of {self.tier_id} at {self.minute:%Y-%m-%d %H:%M}"


class KpiHour(KpiFacts):
    """Per hour and tier: the sum of the hour's KpiMinute rows, rewritten with them, so that a
    window of weeks reads hours instead of tens of thousands of minutes."""

    hour = models.DateTimeField(help_text="Start of the hour (UTC).")

    class Meta:
        db_table = "jobs_kpihour"  # the table it had in clockq.jobs
        constraints = [models.UniqueConstraint(fields=["hour", "tier"], name="kpi_hour_tier")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"KPIs of {self.tier_id} at {self.hour:%Y-%m-%d %H}h"


class GpuMinute(models.Model):
    """Per minute and GPU worker: its capacity and how busy it was. A row exists for every GPU
    worker alive in that minute, idle or not, so utilisation counts idle GPUs."""

    minute = models.DateTimeField()
    worker = models.CharField(max_length=200)
    gpu_index = models.IntegerField()
    busy_ms = models.BigIntegerField(default=0)
    util_ms = models.FloatField(default=0.0)
    slices = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "jobs_gpuminute"  # the table it had in clockq.jobs
        constraints = [models.UniqueConstraint(fields=["minute", "worker"], name="gpu_minute_worker")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"{self.worker} at {self.minute:%Y-%m-%d %H:%M}"


class GpuHour(models.Model):
    """Per hour and GPU worker: the sum of its GpuMinute rows; `minutes` is its capacity (the
    minutes it was alive, or ran slices, in that hour)."""

    hour = models.DateTimeField()
    worker = models.CharField(max_length=200)
    gpu_index = models.IntegerField()
    minutes = models.PositiveIntegerField(default=0)
    busy_ms = models.BigIntegerField(default=0)
    util_ms = models.FloatField(default=0.0)
    slices = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "jobs_gpuhour"  # the table it had in clockq.jobs
        constraints = [models.UniqueConstraint(fields=["hour", "worker"], name="gpu_hour_worker")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"{self.worker} at {self.hour:%Y-%m-%d %H}h"
