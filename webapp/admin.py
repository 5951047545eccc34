"""The operators' console: jobs with their slices and events, tiers, and the job actions."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.forms.models import BaseInlineFormSet
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from clockq.control_state import control
from clockq.control_state.models import ControlDecision, ControlState
from clockq.forecasting.models import Forecast, MetricSample, ModelVersion
from clockq.jobs import metrics as job_metrics
from clockq.jobs import promotion, quotas, services, workloads
from clockq.jobs.models import Job, JobEvent, QueueTier, Slice, UserQuota
from webapp.forms import JobSubmitForm, storable_deadline
from webapp.serializers import admission_note

# The admin's left-hand model list takes 300 px of every page; the header's links and the index
# page reach the same places. Without it, change lists with their filters fit a 1,400 px screen.
admin.site.enable_nav_sidebar = False


@admin.register(QueueTier)
class QueueTierAdmin(admin.ModelAdmin):
    """Service levels, slices and starvation control per tier. A promotion link may only point
    to a more urgent tier, so promotions cannot loop (the model's clean() refuses the rest).
    The promotion tick's and batch chance's intervals are periodic tasks (Periodic tasks)."""

    # The Celery queue is the code in lower case, shown on the tier's page.
    list_display = [
        "code",
        "rank",
        "use",
        "wait_target_ms",
        "start_timeout_ms",
        "base_slice_ms",
        "min_slice_ms",
        "promote_after_rounds",
        "promote_to",
        "chance_jobs",
        "chance_to",
    ]
    list_editable = ["wait_target_ms", "base_slice_ms", "min_slice_ms"]
    # Code, rank and queue are wired into Celery routing; they are not editable here.
    readonly_fields = ["code", "rank", "queue_name"]
    fieldsets = [
        (None, {"fields": ["code", "rank", "use", "queue_name"]}),
        ("Service level", {"fields": ["wait_target_ms", "start_timeout_ms"]}),
        ("Slices", {"fields": ["base_slice_ms", "min_slice_ms"]}),
        ("Starvation control", {"fields": ["promote_after_rounds", "promote_to", "chance_jobs", "chance_to"]}),
    ]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    """Per-user limits. Users without a row here, and empty fields, get the defaults below."""

    list_display = [
        "user",
        "max_active_jobs",
        "max_checkpoint_mb",
        "max_files",
        "active_jobs",
        "checkpoint_mb_used",
        "files_used",
    ]
    autocomplete_fields = ["user"]

    def changelist_view(self, request, extra_context=None):
        defaults = (
            f"Defaults: {settings.CLOCKQ_QUOTA_ACTIVE_JOBS} active jobs (CLOCKQ_QUOTA_ACTIVE_JOBS) and "
            f"{settings.CLOCKQ_QUOTA_CHECKPOINT_MB} MB of storage (CLOCKQ_QUOTA_CHECKPOINT_MB: checkpoints, results "
            f"and work folders) and {settings.CLOCKQ_QUOTA_FILES} files in work folders (CLOCKQ_QUOTA_FILES) per "
            f"user, and at most {settings.CLOCKQ_JOB_STORAGE_MB} MB (CLOCKQ_JOB_STORAGE_MB) and "
            f"{settings.CLOCKQ_JOB_FILES} files (CLOCKQ_JOB_FILES) per job; finished jobs' checkpoints and work "
            f"folders are deleted after {settings.CLOCKQ_CHECKPOINT_RETENTION_S} s."
        )
        messages.info(request, defaults)
        return super().changelist_view(request, extra_context)

    @admin.display(description="active jobs now")
    def active_jobs(self, quota):
        return Job.objects.filter(owner=quota.user, state__in=quotas.ACTIVE).count()

    @admin.display(description="storage MB now")
    def checkpoint_mb_used(self, quota):
        return round(quotas.checkpoint_bytes_of(quota.user_id) / quotas.MB, 1)

    @admin.display(description="work-folder files now")
    def files_used(self, quota):
        return quotas.files_of(quota.user_id)


class RecentRowsFormSet(BaseInlineFormSet):
    """Show only the newest rows: a long job has many thousands of slices."""

    limit = 200

    def get_queryset(self):
        return super().get_queryset()[: self.limit]


class SliceInline(admin.TabularInline):
    model = Slice
    formset = RecentRowsFormSet
    extra = 0
    can_delete = False
    ordering = ["-started_at", "-id"]
    fields = [
        "started_at",
        "worker",
        "gpu_index",
        "planned_ms",
        "plan_reason",
        "used_ms",
        "steps",
        "gpu_util",
        "outcome",
        "rolled_back",
        "checkpoint_bytes",
        "checkpoint_ms",
        "restore_ms",
        "paused_ms",
    ]
    readonly_fields = fields
    max_num = 0  # no adding from the admin
    show_change_link = False


class JobEventInline(admin.TabularInline):
    model = JobEvent
    formset = RecentRowsFormSet
    ordering = ["-at", "-id"]
    extra = 0
    can_delete = False
    fields = ["at", "from_state", "to_state", "reason", "actor"]
    readonly_fields = fields
    max_num = 0


class JobAddForm(JobSubmitForm, forms.ModelForm):
    """The submit form's fields and checks, plus the owner; only staff reach the admin, so
    staff-only workloads are allowed. The admin saves it through services.submit_job."""

    class Meta:
        model = Job
        fields = ["owner"]

    submitter = None  # the admin user, set per request by JobAdmin.get_form

    def may_run_commands(self) -> bool:
        return bool(self.submitter and self.submitter.has_perm(workloads.RUN_COMMAND_PERMISSION))

    def quota_owner(self):
        return self.cleaned_data.get("owner")


class JobChangeForm(forms.ModelForm):
    class Meta:
        model = Job
        fields = ["name", "deadline"]

    def clean_deadline(self):
        deadline = storable_deadline(self.cleaned_data.get("deadline"))
        if deadline and deadline != self.initial.get("deadline") and deadline <= timezone.now():
            raise forms.ValidationError("The deadline must be in the future.")
        return deadline


def _run_action(modeladmin, request, queryset, action, verb):
    done, refused = 0, []
    for job in queryset:
        try:
            action(job, actor=request.user.get_username())
            done += 1
        except services.ActionRefused as exc:
            refused.append(str(exc))
    if done:
        modeladmin.message_user(request, f"{verb} {done} job(s).", messages.SUCCESS)
    for reason in refused[:10]:
        modeladmin.message_user(request, reason, messages.WARNING)


@admin.action(description="Cancel selected jobs")
def cancel_jobs(modeladmin, request, queryset):
    _run_action(modeladmin, request, queryset, services.cancel_job, "Cancelled")


@admin.action(description="Requeue selected jobs (resume from last checkpoint)")
def requeue_jobs(modeladmin, request, queryset):
    _run_action(modeladmin, request, queryset, services.requeue_job, "Requeued")


@admin.action(description="Hold selected jobs")
def hold_jobs(modeladmin, request, queryset):
    _run_action(modeladmin, request, queryset, services.hold_job, "Held")


@admin.action(description="Release selected held jobs")
def release_jobs(modeladmin, request, queryset):
    _run_action(modeladmin, request, queryset, services.release_job, "Released")


@admin.action(description="Promote selected waiting jobs (to their tier's promote-to tier)")
def promote_jobs(modeladmin, request, queryset):
    _run_action(modeladmin, request, queryset, promotion.promote_job, "Promoted")


class WorkloadFilter(admin.SimpleListFilter):
    """The workloads in settings, not a SELECT DISTINCT over every job ever submitted."""

    title = "workload"
    parameter_name = "workload"

    def lookups(self, request, model_admin):
        return [(name, name) for name in workloads.available()]

    def queryset(self, request, queryset):
        return queryset.filter(workload=self.value()) if self.value() else queryset


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "owner",
        "tier",
        "workload",
        "state",
        "late",
        "progress_pct",
        "slice_count",
        "failures",
        "submitted_at",
    ]  # the result's size is on the job's page: with it, the list is wider than a 1,400 px screen
    list_filter = ["state", "held_for_admission", "tier", "owner", WorkloadFilter]
    search_fields = ["name", "owner__username", "workload", "last_error"]
    list_select_related = ["owner", "tier"]
    actions = [cancel_jobs, requeue_jobs, hold_jobs, release_jobs, promote_jobs]
    inlines = [SliceInline, JobEventInline]
    readonly_fields = [
        "owner",
        "tier",
        "original_tier",
        "workload",
        "params",
        "state",
        "progress",
        "pending_action",
        "submitted_at",
        "enqueued_at",
        "first_started_at",
        "first_wait_ms",
        "late_at",
        "skipped_rounds",
        "finished_at",
        "wait_ms",
        "run_ms",
        "slice_count",
        "checkpoint_generation",
        "checkpoint_files",
        "dispatch_token",
        "dispatched_at",
        "worker",
        "lease_expires_at",
        "gpu_mem_mib",
        "gpus",
        "placement_note",
        "util_ewma",
        "switch_cost_ms",
        "failures",
        "last_error",
        "result_size",
        "result_stored_at",
        "result_files",
        "last_metrics",
        "held_for_admission",
    ]

    @admin.display(description="late", boolean=True)
    def late(self, job):
        return job.late_at is not None

    @admin.display(description="last metrics")
    def last_metrics(self, job):
        values = job_metrics.latest([job.pk]).get(job.pk, {})
        return ", ".join(f"{name} {value:.4g}" for name, value in sorted(values.items())) or "-"

    @admin.display(description="result", ordering="result_bytes")
    def result_size(self, job):
        return filesizeformat(job.result_bytes) if job.result_files else "-"

    @admin.display(description="progress")
    def progress_pct(self, job):
        return f"{job.progress:.0%}"

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            # Only the owner is a model field here; the rest are the submit form's own fields.
            kwargs.update(form=JobAddForm, fields=JobAddForm.Meta.fields)
            form = super().get_form(request, obj, **kwargs)
            # The permission to run commands is the admin user's own, not the owner's.
            return type(form.__name__, (form,), {"submitter": request.user})
        kwargs["form"] = JobChangeForm
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def get_fields(self, request, obj=None):
        if obj is None:
            return list(JobAddForm.base_fields)
        return ["name", "deadline", *self.readonly_fields]

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def save_model(self, request, obj, form, change):
        if change:
            # Only name and deadline are editable; save just those so a worker's concurrent
            # update of progress or state is never overwritten by a stale form.
            Job.objects.filter(pk=obj.pk).update(name=obj.name, deadline=obj.deadline)
            return
        job = services.submit_job(
            owner=form.cleaned_data["owner"], actor=request.user.get_username(), **form.submission()
        )
        obj.pk = job.pk
        if job.held_for_admission:
            self.message_user(request, f"Job #{job.pk}: {admission_note(control.admission())}", messages.WARNING)

    def has_delete_permission(self, request, obj=None):
        # Deleting would lose the history; cancel instead.
        return False


class ControlStateForm(forms.ModelForm):
    """An operator's override of the control state. Changing a value forces it: the controller
    then records forecasts but changes nothing until the override is cleared (untick "forced")."""

    note = forms.CharField(
        required=False, max_length=500, help_text="Why you force it; kept with the audit rows.", strip=True
    )

    class Meta:
        model = ControlState
        fields = ["admission_open", "prefetch_on", "desired_workers", "forced"]
        help_texts = {
            "forced": "Ticked: your values hold whatever the forecast says. Untick to hand control back to the "
            "forecast (the values stay until the next forecast changes them).",
            "desired_workers": "GPU workers the autoscaler or scale-out hook should run.",
        }

    def clean_desired_workers(self):
        value = self.cleaned_data.get("desired_workers")
        limit = settings.CLOCKQ_MAX_GPU_WORKERS
        if value is not None and value > limit:
            raise forms.ValidationError(f"At most {limit} (CLOCKQ_MAX_GPU_WORKERS).")
        if value is None and self.initial.get("desired_workers") is not None:
            raise forms.ValidationError("Give a number of workers; it cannot be emptied once set.")
        return value

    def clean(self):
        data = super().clean()
        values = {"admission_open", "prefetch_on", "desired_workers"}
        changed = values & set(self.changed_data)
        was_forced = bool(self.initial.get("forced"))
        if not data.get("forced") and changed:
            if was_forced:
                raise forms.ValidationError(
                    "Either clear the override (untick forced and leave the values) or change values and keep "
                    "forced ticked: a value changed without the override would be undone by the next forecast."
                )
            raise forms.ValidationError(
                "Tick forced to set the state by hand: without the override the next forecast would undo it."
            )
        return data


@admin.register(ControlState)
class ControlStateAdmin(admin.ModelAdmin):
    """The load controller's state (clockq/control_state/control.py). One row; every change, by the
    controller or an operator, is a Control decision."""

    form = ControlStateForm
    list_display = ["__str__", "desired_workers", "forced", "forecast_pct", "forecast_at", "reason", "updated_at"]
    readonly_fields = ["forecast_pct", "forecast_at", "reason", "forced_by", "updated_at", "held_for_admission_now"]
    fieldsets = [
        ("Override", {"fields": ["admission_open", "prefetch_on", "desired_workers", "forced", "note"]}),
        ("As the controller sees it", {"fields": readonly_fields}),
    ]

    @admin.display(description="forecast")
    def forecast_pct(self, state):
        return "-" if state.forecast is None else f"{state.forecast:.1%}"

    @admin.display(description="jobs held for admission")
    def held_for_admission_now(self, state):
        return Job.objects.filter(state="held", held_for_admission=True).count()

    def changelist_view(self, request, extra_context=None):
        # There is exactly one row: go straight to it (made with its defaults the first time).
        from django.shortcuts import redirect

        return redirect("admin:control_state_controlstate_change", control.control_state().pk)

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        # Through the services, never obj.save(): they lock the row, write the audit rows and
        # release the held jobs when admission reopens.
        actor = request.user.get_username()
        data = form.cleaned_data
        if data["forced"]:
            control.force_state(
                actor=actor,
                admission_open=data["admission_open"],
                prefetch_on=data["prefetch_on"],
                desired_workers=data["desired_workers"],
                note=data.get("note", ""),
            )
        else:
            control.unforce(actor)


@admin.register(ControlDecision)
class ControlDecisionAdmin(admin.ModelAdmin):
    """Every change of the control state: read-only."""

    list_display = ["at", "what", "old", "new", "actor", "forecast", "reason"]
    list_filter = ["what", "actor"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class _ReadOnly(admin.ModelAdmin):
    """Records the system writes (load samples, trained models, forecasts): shown, not edited."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(MetricSample)
class MetricSampleAdmin(_ReadOnly):
    list_display = ["at", "load_index", "running_gpus", "waiting_gpus", "gpus", "held", "gpu_util", "cpu", "memory"]
    date_hierarchy = "at"


@admin.register(ModelVersion)
class ModelVersionAdmin(_ReadOnly):
    list_display = [
        "created_at",
        "kind",
        "is_champion",
        "chosen",
        "validation_mae",
        "persistence_mae",
        "linear_mae",
        "samples",
        "training_seconds",
    ]
    list_filter = ["kind", "is_champion"]
    date_hierarchy = "created_at"


@admin.register(Forecast)
class ForecastAdmin(_ReadOnly):
    list_display = ["at", "value", "model", "version", "latency_ms", "reason"]
    list_filter = ["model"]
    date_hierarchy = "at"


from webapp import fleet_admin  # noqa: E402, F401  (registers the hosts and GPU workers)
