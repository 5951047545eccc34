from __future__ import annotations

import copy

from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from clockq.control_state import control
from clockq.jobs import workload_params, workloads
from clockq.jobs.models import Job, JobEvent, Slice
from clockq.policy.tiers import TIER_CODES
from webapp.templatetags.clockq_format import error_line


class SliceSerializer(serializers.ModelSerializer):
    # Every GPU worker of the slice, rank 0's first (`worker`). A slice runs on one GPU until
    # the workers run gangs (clockq/fleet/capacity.py), so the list is that one worker.
    workers = serializers.SerializerMethodField()

    class Meta:
        model = Slice
        fields = [
            "id",
            "worker",
            "workers",
            "gpu_index",
            "started_at",
            "ended_at",
            "planned_ms",
            "used_ms",
            "steps",
            "outcome",
            "rolled_back",
            "checkpoint_generation",
            "checkpoint_bytes",
            "checkpoint_ms",
            "restore_ms",
            "paused_ms",
            "gpu_util",
            "plan_reason",
        ]

    @extend_schema_field({"type": "array", "items": {"type": "string"}})
    def get_workers(self, piece: Slice) -> list[str]:
        return [piece.worker] if piece.worker else []


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "from_state", "to_state", "reason", "actor"]


class BuiltOnceFields:
    """A ModelSerializer builds its fields from the model on every instance: for a job, about
    half the cost of serialising it (0.5 of 1.06 ms). They depend only on the class, so build
    them once and give each instance copies (DRF binds fields to their serializer, so they are
    not shared)."""

    _built_fields: dict[type, dict] = {}

    def get_fields(self):
        built = BuiltOnceFields._built_fields.get(type(self))
        if built is None:
            built = BuiltOnceFields._built_fields[type(self)] = super().get_fields()  # type: ignore[misc]
        return copy.deepcopy(built)


class JobSerializer(BuiltOnceFields, serializers.ModelSerializer):
    tier = serializers.CharField(source="tier.code")
    original_tier = serializers.CharField(source="original_tier.code")
    owner = serializers.CharField(source="owner.username")
    slices = serializers.IntegerField(source="slice_count")
    admission_note = serializers.SerializerMethodField(
        help_text="Set while the job is held because admission is closed: why, and that it runs when admission "
        "reopens. Null otherwise."
    )
    last_error = serializers.SerializerMethodField(
        help_text="Why the job last failed, in one line: the exception, without server paths. Empty if it never failed."
    )
    last_error_traceback = serializers.SerializerMethodField(
        help_text="Staff only: the full error the worker recorded (a traceback). Null for anyone else, and when "
        "the job never failed."
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "state",
            "tier",
            "original_tier",
            "workload",
            "params",
            "deadline",
            "progress",
            "slices",
            "wait_ms",
            "run_ms",
            "checkpoint_generation",
            "failures",
            "last_error",
            "last_error_traceback",
            "pending_action",
            "worker",
            "submitted_at",
            "first_started_at",
            "first_wait_ms",
            "late_at",
            "skipped_rounds",
            "finished_at",
            "gpu_mem_mib",
            "gpus",
            "placement_note",
            "util_ewma",
            "switch_cost_ms",
            "result_bytes",
            "work_bytes",
            "work_files",
            "storage_faults",
            "held_for_admission",
            "admission_note",
        ]
        read_only_fields = fields

    @extend_schema_field({"type": "string", "nullable": True})
    def get_admission_note(self, job: Job) -> str | None:
        if job.state != "held" or not job.held_for_admission:
            return None
        # One read of the control state per response, however many jobs it lists.
        if "control_state" not in self.context:
            self.context["control_state"] = control.admission()
        return admission_note(self.context["control_state"])

    @extend_schema_field({"type": "string"})
    def get_last_error(self, job: Job) -> str:
        return error_line(job.last_error)

    @extend_schema_field({"type": "string", "nullable": True})
    def get_last_error_traceback(self, job: Job) -> str | None:
        # The API's views pass the request; without one (no caller known) nobody is staff.
        request = self.context.get("request")
        staff = bool(request and request.user.is_staff)
        return job.last_error if staff and job.last_error else None


def admission_note(state) -> str:
    """What a job held for admission tells its owner (API, job page, submit form)."""
    if state.admission_open:
        return "Held for admission: admission has reopened and the job is being queued."
    when = control.release_note(state)
    return f"Held: {control.closed_note(state)}. The job is kept, and {when}; nothing is dropped."


class ResultFileSerializer(serializers.Serializer):
    name = serializers.CharField()
    bytes = serializers.IntegerField()
    sha256 = serializers.CharField()
    url = serializers.URLField(help_text="Where to download it.")


class ResultSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    bytes = serializers.IntegerField(help_text="All files together.")
    stored_at = serializers.DateTimeField()
    files = ResultFileSerializer(many=True)


class CurveSerializer(serializers.Serializer):
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()), help_text="[[step, value], ...]"
    )
    latest = serializers.ListField(child=serializers.FloatField(), allow_null=True)


class SliceEndSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    outcome = serializers.CharField()
    preempted = serializers.BooleanField(help_text="Cut short to make way for a waiting RT job.")
    at = serializers.DateTimeField()


class MetricsSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    metrics = serializers.DictField(child=CurveSerializer(), help_text="By metric name.")
    slice_ends = SliceEndSerializer(many=True)


# --- For the OpenAPI schema only ------------------------------------------------------------
# The views validate with webapp.forms.JobSubmitForm and build their answers by hand; these
# serializers only describe those bodies to drf-spectacular (GET /api/schema).


def _param_schema(param: workload_params.Int | workload_params.Float | workload_params.StrList) -> dict:
    if isinstance(param, workload_params.StrList):
        schema = {
            "type": "array",
            "items": {"type": "string", "maxLength": param.max_len},
            "minItems": 1,
            "maxItems": param.max_items,
        }
    else:
        number = "integer" if isinstance(param, workload_params.Int) else "number"
        schema = {"type": number, "minimum": param.min, "maximum": param.max}
    if param.default is not None:
        schema["default"] = param.default
    if param.help:
        schema["description"] = param.help
    return schema


def _params_schema(spec: workloads.WorkloadSpec) -> dict:
    """The JSON schema of one workload's params, from its spec in clockq.jobs.workloads."""
    schema = {
        "type": "object",
        "properties": {key: _param_schema(param) for key, param in spec.params.items()},
        "additionalProperties": False,
        "description": "Any param left out takes its default; any other param is refused.",
    }
    if required := [key for key, param in spec.params.items() if param.default is None]:
        schema["required"] = required
    return schema


class _JobSubmitBase(serializers.Serializer):
    # The form strips the name; one of spaces only is missing.
    name = serializers.CharField(min_length=1, max_length=200, validators=[RegexValidator(r"\S")])
    tier = serializers.ChoiceField(choices=list(TIER_CODES), help_text="Queue tier, most urgent first.")
    deadline = serializers.DateTimeField(required=False, allow_null=True, help_text="ISO 8601; must be in the future.")
    gpu_mem_mib = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=4 * 2**20,
        help_text="The job only starts on a GPU with this much free memory.",
    )
    gpus = serializers.IntegerField(
        required=False,
        min_value=1,
        default=1,
        help_text="GPUs the job needs at once; more than the cluster can run is refused, naming the most it can.",
    )


class _ClosedJobSubmit(OpenApiSerializerExtension):
    """The submit bodies as closed objects (`additionalProperties: false`): the API refuses any
    field it does not know."""

    target_class = _JobSubmitBase
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": False}


def _submit_serializer(name: str) -> type[serializers.Serializer]:
    """The body of POST /api/jobs for one workload, e.g. SyntheticJobSubmit in the schema."""
    spec = workloads.spec(name)
    workload_field = extend_schema_field({"type": "string", "enum": [name]})(
        type("WorkloadField", (serializers.CharField,), {})
    )
    params_field = extend_schema_field(_params_schema(spec))(type("ParamsField", (serializers.DictField,), {}))
    doc = f"Submit a `{name}` job."
    if spec.runs_user_code:
        doc += " Only for users with the `jobs.run_command` permission."
    camel = "".join(part.capitalize() for part in name.split("_"))
    return type(
        f"{camel}JobSubmitSerializer",
        (_JobSubmitBase,),
        {
            "__doc__": doc,
            "workload": workload_field(),
            "params": params_field(required=any(p.default is None for p in spec.params.values())),
        },
    )


# The body of POST /api/jobs: one shape per workload, told apart by `workload`. Any other field
# is refused with a 400.
JobSubmitSerializer = PolymorphicProxySerializer(
    component_name="JobSubmit",
    serializers={name: _submit_serializer(name) for name in workloads.available()},
    resource_type_field_name="workload",
)


class JobDetailSerializer(JobSerializer):
    """GET /api/jobs/{job_id}; `slice_history` and `events` only with `?history=1`."""

    # Not read-only, or drf-spectacular would list them as always present.
    slice_history = SliceSerializer(many=True, required=False)
    events = EventSerializer(many=True, required=False)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "slice_history", "events"]


class JobPageSerializer(serializers.Serializer):
    """One page of GET /api/jobs (50 jobs a page, newest first)."""

    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = JobSerializer(many=True)


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


class TierQueueSerializer(serializers.Serializer):
    tier = serializers.CharField()
    queue = serializers.CharField()
    rank = serializers.IntegerField()
    use = serializers.CharField()
    waiting = serializers.IntegerField()
    running = serializers.IntegerField()
    held = serializers.IntegerField()
    wait_target_ms = serializers.IntegerField(allow_null=True)


class QueuesSerializer(serializers.Serializer):
    tiers = TierQueueSerializer(many=True)
    workers = serializers.ListField(
        child=serializers.DictField(),
        allow_null=True,
        help_text="The live workers' latest heartbeats, each with `degraded` (why, or null), `drained` (by "
        "whom, when and why, or null) and, for a GPU worker, `consuming` (whether it takes jobs now); "
        "`pid` (the worker's process id) for staff only; null when the broker cannot be read.",
    )


class GpuSampleSerializer(serializers.Serializer):
    host = serializers.CharField()
    gpu_index = serializers.IntegerField(min_value=0)
    ts = serializers.FloatField(min_value=0, help_text="When it was sampled, in seconds since the epoch.")
    simulated = serializers.BooleanField()
    gpu_util = serializers.FloatField(allow_null=True, min_value=0, max_value=1)
    mem_util = serializers.FloatField(allow_null=True, min_value=0, max_value=1)
    mem_used_mib = serializers.IntegerField(allow_null=True, min_value=0)
    mem_total_mib = serializers.IntegerField(allow_null=True, min_value=0)
    pcie_tx_kbps = serializers.IntegerField(allow_null=True, min_value=0)
    pcie_rx_kbps = serializers.IntegerField(allow_null=True, min_value=0)
    sm_clock_mhz = serializers.IntegerField(allow_null=True, min_value=0)
    power_w = serializers.FloatField(allow_null=True, min_value=0)
    temperature_c = serializers.FloatField(allow_null=True)
    process_count = serializers.IntegerField(allow_null=True, min_value=0)
    host_cpu = serializers.FloatField(allow_null=True, min_value=0, max_value=1)
    host_mem = serializers.FloatField(allow_null=True, min_value=0, max_value=1)
    error = serializers.CharField(allow_null=True)


class GpusSerializer(serializers.Serializer):
    gpus = GpuSampleSerializer(many=True)
    stale_after_s = serializers.IntegerField()
    now = serializers.FloatField()
