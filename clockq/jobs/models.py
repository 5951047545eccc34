"""The database is the source of truth: jobs, their tiers, slices and events."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from clockq.policy.promotion import TierLinks, promotion_problems
from clockq.policy.slicing import PendingAction, SliceOutcome
from clockq.policy.states import ACTIVE_STATES, JobState


def new_token() -> str:
    return uuid.uuid4().hex


class QueueTier(models.Model):
    code = models.CharField(max_length=2, unique=True)
    rank = models.PositiveSmallIntegerField(unique=True, help_text="0 is the most urgent tier.")
    use = models.CharField(max_length=100)
    queue_name = models.CharField(max_length=20, unique=True, editable=False)
    wait_target_ms = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Target wait before the first start; empty means best effort."
    )
    base_slice_ms = models.PositiveIntegerField(
        default=50, validators=[MinValueValidator(1), MaxValueValidator(3_600_000)]
    )
    min_slice_ms = models.PositiveIntegerField(
        default=20, validators=[MinValueValidator(1), MaxValueValidator(3_600_000)]
    )
    start_timeout_ms = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="A job not started this long after submission ends timed_out (a late inference is "
        "worthless). Empty: never; a job that misses its wait target is only marked late.",
    )
    # Starvation control (clockq/policy/promotion.py). A promoted job runs one slice in the
    # higher tier, then returns to its own.
    promote_after_rounds = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(10_000)],
        help_text="Promote a waiting job skipped in this many consecutive rounds. Empty: never.",
    )
    promote_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="A more urgent tier."
    )
    chance_jobs = models.PositiveSmallIntegerField(
        default=0,
        validators=[MaxValueValidator(1_000)],
        help_text="At each batch chance (a periodic task, every 2 h by default), this many of the "
        "oldest waiting jobs get one slice in the chance tier. 0: none.",
    )
    chance_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="A more urgent tier."
    )

    class Meta:
        ordering = ["rank"]

    def __str__(self) -> str:
        return f"{self.code} ({self.use})"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.min_slice_ms and self.base_slice_ms and self.min_slice_ms > self.base_slice_ms:
            raise ValidationError({"min_slice_ms": "The minimum slice cannot exceed the base slice."})
        # Not keyed by field: the admin's tier list edits only some fields, and a form cannot
        # show an error on a field it does not have. Each message names its field.
        if self.promote_to_id is not None and not self.promote_after_rounds:
            raise ValidationError("Promote after rounds: say after how many skipped rounds to promote.")
        if self.chance_jobs and self.chance_to_id is None:
            raise ValidationError("Chance to: choose the tier whose queue the batch chance runs through.")
        # The whole table as it would be after this edit: no promotion may point down or loop.
        table = {t.pk: t for t in QueueTier.objects.exclude(pk=self.pk)} | {self.pk: self}
        problems = promotion_problems(
            {
                t.code: TierLinks(
                    t.rank,
                    table[t.promote_to_id].code if t.promote_to_id in table else None,
                    table[t.chance_to_id].code if t.chance_to_id in table else None,
                )
                for t in table.values()
            }
        )
        if problems:
            raise ValidationError([f"{p.field.replace('_', ' ').capitalize()}: {p.message}" for p in problems])


class Job(models.Model):
    State = models.TextChoices("State", [(s.value, s.value) for s in JobState])

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    tier = models.ForeignKey(QueueTier, on_delete=models.PROTECT, related_name="jobs")
    original_tier = models.ForeignKey(QueueTier, on_delete=models.PROTECT, related_name="+")
    workload = models.CharField(max_length=50)
    params = models.JSONField(default=dict, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)

    state = models.CharField(max_length=10, choices=State.choices, default=JobState.QUEUED, db_index=True)
    progress = models.FloatField(default=0.0)
    # What an operator asked of a running job (a PendingAction); honoured at the next slice boundary.
    pending_action = models.CharField(max_length=10, blank=True, default=PendingAction.NONE)

    submitted_at = models.DateTimeField(auto_now_add=True)
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="When the job last entered its queue.")
    first_started_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # From submission to the first start: the wait the service levels and KPIs measure.
    first_wait_ms = models.BigIntegerField(null=True, blank=True)
    # When the job passed its tier's wait target without having started; it keeps its place.
    late_at = models.DateTimeField(null=True, blank=True)
    # Consecutive rounds in which slices started and none was this job's (clockq/policy/promotion.py).
    skipped_rounds = models.PositiveIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True, db_index=True)
    wait_ms = models.BigIntegerField(default=0)
    run_ms = models.BigIntegerField(default=0)

    slice_count = models.PositiveIntegerField(default=0)
    # The highest checkpoint generation ever named; numbers only grow, so a name is never reused.
    checkpoint_generation = models.PositiveIntegerField(default=0)
    # The checkpoint files the job restores from, newest first (workers/checkpoints.py): a file
    # becomes current only when the ownership-checked update of its worker names it here.
    checkpoint_files = models.JSONField(default=list, blank=True)
    # Size of the newest checkpoint; the store keeps two generations, so the job holds about
    # twice this on disk until retention deletes its checkpoints (then 0).
    checkpoint_bytes = models.PositiveBigIntegerField(default=0)
    checkpoints_deleted_at = models.DateTimeField(null=True, blank=True)
    # What the job produced (clockq/jobs/results.py): stored before it is marked succeeded.
    result_files = models.JSONField(default=list, blank=True, help_text="[{name, bytes, sha256}]")
    result_bytes = models.PositiveBigIntegerField(default=0)
    result_stored_at = models.DateTimeField(null=True, blank=True)
    dispatch_token = models.CharField(max_length=32, default=new_token)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True, default="")
    # While running: the worker's lease, renewed as it works. Past it, the reaper takes the job back.
    lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    slice_started_at = models.DateTimeField(null=True, blank=True)
    # Measured by workers: recent GPU utilisation (EWMA, 0-1) and the cost of one switch (ms).
    util_ewma = models.FloatField(null=True, blank=True)
    switch_cost_ms = models.FloatField(null=True, blank=True)
    gpu_mem_mib = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU memory the job needs; it only starts on a GPU with this much free."
    )
    placement_note = models.CharField(max_length=300, blank=True, default="", help_text="Why it is not running.")
    failures = models.PositiveIntegerField(default=0, help_text="Failed slices since the last success or requeue.")
    last_error = models.TextField(blank=True, default="")
    # Held because admission was closed when it was submitted (clockq/jobs/control.py), not by an
    # operator: only these are released when admission reopens.
    held_for_admission = models.BooleanField(default=False)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["state", "tier"]),
            models.Index(fields=["owner", "-id"]),
            # A submit's quota check (clockq/jobs/quotas.py) reads the owner's active jobs and the
            # jobs holding storage through these, not through all of the owner's history.
            models.Index(fields=["owner", "state"], name="job_owner_state"),
            models.Index(
                fields=["owner"],
                condition=models.Q(checkpoint_bytes__gt=0) | models.Q(result_bytes__gt=0),
                name="job_owner_storage",
            ),
            models.Index(fields=["late_at"]),  # the KPI rollup reads late marks by time
            # Reopening admission releases these, and only these.
            models.Index(fields=["held_for_admission", "state"]),
        ]
        permissions = [("run_command", "Can submit jobs that run their own program (the command workload)")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


class UserQuota(models.Model):
    """A user's limits, where they differ from the defaults in settings (an empty field means
    the default). Checked when a job is submitted, and when a job's checkpoint grows."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota")
    max_active_jobs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Queued, running and held jobs at once. Empty: CLOCKQ_QUOTA_ACTIVE_JOBS."
    )
    max_checkpoint_mb = models.PositiveIntegerField(
        null=True, blank=True, help_text="Checkpoint storage, in MB. Empty: CLOCKQ_QUOTA_CHECKPOINT_MB."
    )

    def __str__(self) -> str:
        return f"quota of {self.user}"


class Slice(models.Model):
    Outcome = models.TextChoices("Outcome", [(o.value, o.value) for o in SliceOutcome])

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="slices")
    worker = models.CharField(max_length=200)
    gpu_index = models.IntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    planned_ms = models.PositiveIntegerField()
    used_ms = models.PositiveIntegerField()
    steps = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    checkpoint_bytes = models.PositiveBigIntegerField(default=0)
    checkpoint_ms = models.FloatField(default=0.0)
    restore_ms = models.FloatField(default=0.0)
    gpu_util = models.FloatField(null=True, blank=True, help_text="Mean GPU utilisation over the slice.")
    plan_reason = models.CharField(max_length=10, blank=True, default="", help_text="formula, floor or overhead")
    last_step = models.BigIntegerField(null=True, blank=True, help_text="The job's newest metric step at the end.")
    preempted = models.BooleanField(default=False, help_text="Cut short to make way for a waiting RT job.")

    class Meta:
        ordering = ["started_at", "id"]
        # The promotion tick reads slices by start, the KPI rollup by end.
        indexes = [models.Index(fields=["started_at"]), models.Index(fields=["ended_at"])]


class JobMetric(models.Model):
    """One named metric curve of a job (clockq/policy/metrics.py: bounded, thinned, the newest
    value always kept). Written by workers at checkpointed slice boundaries, never per step."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    name = models.CharField(max_length=64)
    points = models.JSONField(default=list, help_text="[[step, value], ...] on the grid of `stride`")
    stride = models.PositiveIntegerField(default=1)
    last = models.JSONField(null=True, blank=True, help_text="[step, value]: the newest point, if off the grid")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="job_metric_name")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} of job {self.job_id}"


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    reason = models.TextField()
    actor = models.CharField(max_length=200)

    class Meta:
        ordering = ["at", "id"]
        # The KPI rollup reads promotions by time every minute; there is an event per state change.
        indexes = [models.Index(fields=["at"])]


class PromotionClock(models.Model):
    """One row: when the last promotion tick ended, so that each tick judges exactly the slices
    started since. Locked for the length of a tick, so two ticks never count one round twice."""

    last_tick_at = models.DateTimeField(null=True, blank=True)
    rounds = models.PositiveBigIntegerField(default=0, help_text="Ticks in which slices started.")

    def __str__(self) -> str:
        return f"promotion clock (last tick {self.last_tick_at})"


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
    """Per minute and tier. Filled by the KPI rollup periodic task (clockq/jobs/kpi_rollup.py), so
    /api/kpis and the dashboard never scan every Slice. A minute's row is recomputed while late
    data can still arrive."""

    minute = models.DateTimeField(help_text="Start of the minute (UTC).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["minute", "tier"], name="kpi_minute_tier")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"KPIs of {self.tier_id} at {self.minute:%Y-%m-%d %H:%M}"


class KpiHour(KpiFacts):
    """Per hour and tier: the sum of the hour's KpiMinute rows, rewritten with them, so that a
    window of weeks reads hours instead of tens of thousands of minutes."""

    hour = models.DateTimeField(help_text="Start of the hour (UTC).")

    class Meta:
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
        constraints = [models.UniqueConstraint(fields=["hour", "worker"], name="gpu_hour_worker")]
        indexes = [models.Index(fields=["hour"])]

    def __str__(self) -> str:
        return f"{self.worker} at {self.hour:%Y-%m-%d %H}h"


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
    # An operator's override: the controller records forecasts but changes nothing while it holds.
    forced = models.BooleanField(default=False)
    forced_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
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
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.what}: {self.old} -> {self.new} by {self.actor}"


class MetricSample(models.Model):
    """The cluster's load at one moment, recorded by a beat task (clockq/jobs/load_history.py)
    every CLOCKQ_LOAD_SAMPLE_EVERY_S: the history the load predictor trains on. Shares are 0..1;
    a reading no host gave is empty."""

    at = models.DateTimeField(unique=True, help_text="When it was taken, to the second.")
    gpu_util = models.FloatField(null=True, blank=True, help_text="Mean SM busy over the GPUs that report it.")
    cpu = models.FloatField(null=True, blank=True, help_text="Mean CPU load over the GPU hosts.")
    memory = models.FloatField(null=True, blank=True, help_text="Mean memory use over the GPU hosts.")
    queue_depth = models.JSONField(default=dict, blank=True, help_text="Queued jobs by current tier: {tier: n}.")
    held = models.PositiveIntegerField(default=0, help_text="Jobs held for admission (not counted as demand).")
    running_gpus = models.PositiveIntegerField(default=0, help_text="Busy GPUs: jobs running.")
    waiting_gpus = models.PositiveIntegerField(default=0, help_text="GPUs that queued jobs ask for.")
    gpus = models.PositiveIntegerField(default=0, help_text="Capacity: GPU workers alive.")
    load_index = models.FloatField(
        null=True, blank=True, help_text="(running + waiting GPUs) / GPUs, at most 2 (clockq/policy/load.py)."
    )
    hosts = models.JSONField(
        default=dict, blank=True, help_text="Per host: {host: {gpus, gpu_util, cpu, memory, busy}}."
    )

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        index = "-" if self.load_index is None else f"{self.load_index:.2f}"
        return f"load {index} at {self.at:%Y-%m-%d %H:%M:%S}"


class ModelVersion(models.Model):
    """One model trained by a run of the load predictor's training (predictor/training.py): an
    LSTM or a linear model, its saved file, its validation MAE next to persistence's and
    linear's on the same held-out part, and what the run chose (`chosen`: persistence, linear or
    lstm, by predictor.evaluation.select_champion). Each run writes one row per trained model;
    at most one row in the table `is_champion`, the one that serves. When a run chooses
    persistence, no row is the champion and the forecast is persistence."""

    KINDS = [("lstm", "LSTM"), ("linear", "linear")]

    created_at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=10, choices=KINDS, default="lstm")
    path = models.CharField(max_length=500, blank=True, default="", help_text="The saved .keras file (empty: none).")
    train_windows = models.PositiveIntegerField(default=0)
    validation_windows = models.PositiveIntegerField(default=0)
    test_windows = models.PositiveIntegerField(default=0)
    samples = models.PositiveIntegerField(default=0, help_text="Load samples the run read.")
    validation_mae = models.FloatField(null=True, blank=True, help_text="This model's validation MAE.")
    persistence_mae = models.FloatField(null=True, blank=True)
    linear_mae = models.FloatField(null=True, blank=True)
    test_metrics = models.JSONField(default=dict, blank=True, help_text="{model: {mae, rmse, bucket_accuracy}}.")
    chosen = models.CharField(
        max_length=12, default="persistence", help_text="What this run chose: persistence, linear or lstm."
    )
    is_champion = models.BooleanField(default=False, help_text="This model serves the forecasts.")
    training_seconds = models.FloatField(default=0.0)
    notes = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} model {self.pk}" + (" (champion)" if self.is_champion else "")


class Forecast(models.Model):
    """One forecast of the load index `horizon_s` ahead, made at `at` from the samples up to
    `input_at`, by `model` (persistence, linear or lstm, with the ModelVersion that served)."""

    at = models.DateTimeField()
    horizon_s = models.PositiveIntegerField()
    value = models.FloatField(help_text="The forecast load index.")
    model = models.CharField(max_length=12)
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField(blank=True, default="")
    input_at = models.DateTimeField(null=True, blank=True, help_text="The newest load sample it read.")
    latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"forecast {self.value:.2f} by {self.model} at {self.at:%Y-%m-%d %H:%M:%S}"
