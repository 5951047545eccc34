"""The database is the source of truth: jobs, their tiers, slices and events."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from clockq.jobs.tier_rank import tier_rank
from clockq.policy.promotion import TierLinks, promotion_problems
from clockq.policy.slicing import PendingAction, SliceOutcome
from clockq.policy.states import ACTIVE_STATES, JobState
from clockq.policy.tiers import TierSpec, tier


def new_token() -> str:
    return uuid.uuid4().hex


class QueueTier(models.Model):
    """One row per tier of clockq/policy/tiers.py, keyed by its code and seeded from it
    (clockq/jobs/tiers.py): the operator's settings for the tier. What the tier is (its rank,
    queue and flags) is the definition's alone, reached through `spec`; a system check and the
    workers refuse rows for codes it does not define."""

    code = models.CharField(max_length=2, unique=True)
    use = models.CharField(max_length=100)
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
    # Starvation control (clockq/policy/promotion.py). A promoted job is scheduled in the higher
    # tier until it has had the first rung of that tier's service ladder there, then returns.
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
        "oldest waiting jobs are lifted to the chance tier, as a promotion. 0: none.",
    )
    chance_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="A more urgent tier."
    )

    class Meta:
        ordering = [tier_rank()]

    def __str__(self) -> str:
        return f"{self.code} ({self.use})"

    @property
    def spec(self) -> TierSpec:
        """What this tier is (clockq/policy/tiers.py), found by its code."""
        return tier(self.code)

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def queue_name(self) -> str:
        return self.spec.queue_name

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
    promoted_run_ms = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Its run time when it was promoted: its service in the higher tier counts from here.",
    )
    level_from_ms = models.BigIntegerField(
        default=0,
        help_text="Its run time when its service level began to count: at a batch chance (a chance to "
        "be scheduled, whatever it has run), else 0.",
    )

    slice_count = models.PositiveIntegerField(default=0)
    # The highest checkpoint generation ever named; numbers only grow, so a name is never reused.
    checkpoint_generation = models.PositiveIntegerField(default=0)
    # The checkpoint files the job restores from, newest first (clockq/jobs/checkpoints.py): a file
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
    # What the job's work folder holds (its program's files and logs), as the worker last measured
    # it while the job ran (workers/storage_watch.py): it counts toward the owner's quota.
    work_bytes = models.PositiveBigIntegerField(default=0)
    work_files = models.PositiveIntegerField(default=0)
    # Storage faults met by this job's writes while the store took others (a small probe): at
    # CLOCKQ_JOB_STORAGE_FAULTS, the fault is the job's and it fails (workers/run/failures.py).
    storage_faults = models.PositiveIntegerField(default=0)
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
    # A gang: all its GPUs at once or none (clockq/policy/gangs.py). Checked at submit against
    # the cluster (clockq/fleet/capacity.py).
    gpus = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="GPUs the job needs at once."
    )
    placement_note = models.CharField(max_length=300, blank=True, default="", help_text="Why it is not running.")
    failures = models.PositiveIntegerField(default=0, help_text="Failed slices since the last success or requeue.")
    last_error = models.TextField(blank=True, default="")
    # Held because admission was closed when it was submitted (clockq/control_state/control.py), not by an
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
                condition=models.Q(checkpoint_bytes__gt=0) | models.Q(result_bytes__gt=0) | models.Q(work_bytes__gt=0),
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


class UserShare(models.Model):
    """A user's recent GPU service in one tier, for fair share within the tier
    (clockq/policy/ordering.py). Each GPU-second counts `share_weight` of when it was given, which
    is how a decaying share keeps its order without being rewritten as time passes."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    tier = models.ForeignKey(QueueTier, on_delete=models.CASCADE, related_name="+")
    weighted_gpu_s = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tier"], name="user_share_user_tier")]

    def __str__(self) -> str:
        return f"{self.user_id} in {self.tier_id}: {self.weighted_gpu_s:.3g}"


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
    max_files = models.PositiveIntegerField(
        null=True, blank=True, help_text="Files in the work folders of running jobs. Empty: CLOCKQ_QUOTA_FILES."
    )

    def __str__(self) -> str:
        return f"quota of {self.user}"


class SliceQuerySet(models.QuerySet):
    def roll_back_to(self, job_id: int, generation: int) -> int:
        """The job went back to checkpoint `generation` (0: to its beginning): mark the slices
        whose steps that checkpoint does not hold, those recorded after the one that took it, as
        rolled back. How many were marked; none when no recorded slice took that generation (it
        was taken before slices said so)."""
        after = self.filter(job_id=job_id, steps__gt=0, rolled_back=False)
        if generation:
            took = self.filter(job_id=job_id, checkpoint_generation=generation).values_list("id", flat=True).first()
            if took is None:
                return 0
            after = after.filter(id__gt=took)
        return after.update(rolled_back=True)


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
    paused_ms = models.FloatField(
        default=0.0, help_text="Paused in place for RT jobs in its GPU's RT lane: neither service nor a switch."
    )
    gpu_util = models.FloatField(null=True, blank=True, help_text="Mean GPU utilisation over the slice.")
    plan_reason = models.CharField(max_length=10, blank=True, default="", help_text="formula, floor or overhead")
    last_step = models.BigIntegerField(null=True, blank=True, help_text="The job's newest metric step at the end.")
    preempted = models.BooleanField(default=False, help_text="Cut short to make way for a waiting RT job.")
    checkpoint_generation = models.PositiveIntegerField(
        null=True, blank=True, help_text="The checkpoint generation its end took, if it took one."
    )
    rolled_back = models.BooleanField(
        default=False,
        help_text="Its steps were undone: the job went back to a checkpoint from before its end (its own "
        "was never written, it took none, or the slice failed), and ran them again.",
    )

    objects = SliceQuerySet.as_manager()

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
