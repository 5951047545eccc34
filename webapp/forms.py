"""One validation path for every way a job comes in: the web form, the API and the admin."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar
from urllib.parse import parse_qsl

from django import forms
from django.conf import settings
from django.forms.fields import InvalidJSONInput, JSONString
from django.utils import timezone

from clockq.fleet import capacity
from clockq.jobs import quotas, workloads
from clockq.jobs.workload_params import clean_params
from clockq.policy.tiers import DEFAULT_TIER, TIER_CODES
from webapp import client_input, param_fields

MAX_PARAMS_BYTES = 16 * 1024
F = TypeVar("F", bound=forms.Form)


def storable_deadline(deadline: datetime | None) -> datetime | None:
    """A deadline the database can hold: in UTC, year 9999 at the latest. `9999-12-31T23:59-00:01`
    is valid ISO 8601 but falls in the year 10000 in UTC, which no backend stores."""
    if deadline is None:
        return None
    try:
        return deadline.astimezone(UTC)
    except OverflowError:
        raise forms.ValidationError("The deadline is out of range; the latest is 9999-12-31 in UTC.") from None


FORM_ENCODED = "application/x-www-form-urlencoded"


def posted_fields(request) -> dict[str, str]:
    """A form post's fields, read from its raw body as the API reads a JSON body, and checked by
    the same code (client_input.check): every field given once, all text UTF-8 and storable.

    Django's own reading would hide what the API refuses: it decodes invalid UTF-8 as U+FFFD and
    keeps the last of two fields of one name. Only url-encoded posts are read (what the form
    sends): a multipart one is decoded by Django alone, its invalid UTF-8 lost."""
    if request.content_type != FORM_ENCODED:
        raise client_input.InputRefused(None, f"must be posted as {FORM_ENCODED}, as the form does")
    # Invalid bytes, raw or %-escaped, become lone surrogates, which the check refuses.
    text = request.body.decode("utf-8", "surrogateescape")
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            encoding="utf-8",
            errors="surrogateescape",
            max_num_fields=settings.DATA_UPLOAD_MAX_NUMBER_FIELDS,
        )
    except ValueError:
        raise client_input.InputRefused(None, "has too many fields") from None
    fields = client_input.object_from_pairs(pairs)
    client_input.check(fields)
    return fields


class SubmittedJSONField(forms.JSONField):
    """A JSON field whose text is read by client_input.loads, as an API body is: bounded in
    depth, no key twice, storable text. Re-rendered, it shows the text as it was typed, which
    cannot fail: Django's own field parses it again (a RecursionError when it nests deeply) and
    writes it out unescaped (a UnicodeEncodeError for a lone surrogate)."""

    def __init__(self, *, name: str, **kwargs):
        super().__init__(**kwargs)
        self.name = name

    def to_python(self, value):
        if not isinstance(value, str) or value in self.empty_values:
            return super().to_python(value)
        try:
            converted = client_input.loads(value, field=self.name)
        except client_input.InputRefused as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data, initial):
        if isinstance(data, str) and not self.disabled:
            return InvalidJSONInput(data)  # Django's marker for text shown as it is
        return super().bound_data(data, initial)


class JobSubmitForm(forms.Form):
    name = forms.CharField(max_length=200, strip=True)
    tier = forms.ChoiceField(choices=[(c, c) for c in TIER_CODES], initial=DEFAULT_TIER.code)
    workload = forms.ChoiceField(choices=())
    params = SubmittedJSONField(name="params", required=False, initial=dict, widget=forms.Textarea(attrs={"rows": 4}))
    deadline = forms.DateTimeField(required=False, help_text="Optional; ISO 8601, e.g. 2030-01-31T18:00:00Z")
    gpu_mem_mib = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=4 * 2**20,
        label="GPU memory (MiB)",
        help_text="Optional; the job only starts on a GPU with this much free memory.",
    )
    gpus = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        initial=1,
        label="GPUs",
        help_text="How many GPUs the job needs at once (1 if empty).",
    )

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["workload"].choices = [(name, name) for name in workloads.available()]

    def may_run_commands(self) -> bool:
        return bool(self.user and self.user.has_perm(workloads.RUN_COMMAND_PERMISSION))

    def quota_owner(self):
        """Whose quota the job counts against: the submitter's own."""
        return self.user

    def submission(self) -> dict:
        """The cleaned input as keyword arguments for services.submit_job."""
        cd = self.cleaned_data
        return {
            "name": cd["name"],
            "tier_code": cd["tier"],
            "workload": cd["workload"],
            "params": cd["params"],
            "deadline": cd["deadline"],
            "gpu_mem_mib": cd.get("gpu_mem_mib"),
            "gpus": cd["gpus"],  # clean_gpus: 1 when left empty
        }

    def clean_gpus(self):
        gpus = self.cleaned_data.get("gpus") or 1
        if problem := capacity.gpus_problem(gpus):
            raise forms.ValidationError(problem, code="too_many_gpus")
        return gpus

    def clean_params(self):
        params = self.cleaned_data.get("params")
        if params is None or params == "":
            return {}
        if len(json.dumps(params)) > MAX_PARAMS_BYTES:
            raise forms.ValidationError(f"params must be at most {MAX_PARAMS_BYTES} bytes of JSON")
        return params

    def clean_deadline(self):
        deadline = storable_deadline(self.cleaned_data.get("deadline"))
        if deadline and deadline <= timezone.now():
            raise forms.ValidationError("The deadline must be in the future.")
        return deadline

    def add_params_errors(self, workload: str, exc: workloads.ParamsError) -> None:
        """Say what the schema refused in the params: here, all of it on the params field."""
        self.add_error("params", "; ".join(f"{k}: {v}" for k, v in exc.errors.items()))

    def clean(self):
        cleaned = super().clean()
        workload = cleaned.get("workload")
        if workload and "params" in cleaned:
            try:
                # The permission is looked up only for a workload that needs it (a query per submit).
                may_run = workloads.spec(workload).runs_user_code and self.may_run_commands()
                cleaned["params"] = workloads.validate(workload, cleaned["params"], may_run_commands=may_run)
            except (workloads.UnknownWorkload, PermissionError) as exc:
                self.add_error("workload", str(exc))
            except workloads.ParamsError as exc:
                self.add_params_errors(workload, exc)
        owner = self.quota_owner()
        if owner is not None and not self.errors:
            try:
                quotas.check_submit(owner, workloads.declared_state_bytes(workload, cleaned["params"]))
            except quotas.QuotaExceeded as exc:
                self.add_error(None, str(exc))
        return cleaned


def binder(form_class: type[F], **kwargs) -> Callable[[dict], F]:
    """Forms of `form_class` for many inputs (a batch's entries), sharing one copy of the fields.

    Django deep-copies a form's fields for every instance, so that an instance may change its
    own; that copy, and setting the workload choices, is most of validating a job, and a large
    part of a batch's cost (docs/benchmarks.md has the figures). Validation reads the
    fields and changes nothing in them, so each entry's form is a shallow copy of one unbound
    form, bound to the entry, with the per-form state Django keeps (its errors, its bound
    fields) its own. tests/webapp/test_batch_submit.py checks that each entry gets exactly the
    errors a form of its own gives."""
    template = form_class(**kwargs)

    def bind(data: dict) -> F:
        form = copy.copy(template)
        form.is_bound, form.data = True, data
        form._errors, form._bound_fields_cache = None, {}
        return form

    return bind


class OptionalJSONField(SubmittedJSONField):
    """The page's JSON box: empty until something is typed (never a `{}` or `null` of its own),
    as an empty box means "use the fields"."""

    def prepare_value(self, value):
        return "" if value is None else super().prepare_value(value)


class WorkloadSelect(forms.Select):
    """The workload list: a workload the user may not submit is listed, but cannot be chosen."""

    refused: frozenset[str] = frozenset()

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if value in self.refused:
            option["attrs"]["disabled"] = True
            option["label"] = f"{label} (needs the 'run command' permission)"
        return option


def default_workload(specs: dict[str, workloads.WorkloadSpec], refused: frozenset[str]) -> str | None:
    """The workload the page offers first: one the user may run, and one that runs no program
    of their own where there is such a one (it needs no program to be typed in)."""
    allowed = [name for name in specs if name not in refused]
    plain = [name for name in allowed if not specs[name].runs_user_code]
    return next(iter(plain or allowed or list(specs)), None)


class WebJobForm(JobSubmitForm):
    """The submit page: the shared checks, and a field for each param of every workload, of
    which the chosen workload's are read. The JSON box, when filled, is used instead of the
    fields; a field changed from its default that the JSON contradicts is refused, both named."""

    params = OptionalJSONField(
        name="params",
        required=False,
        label="Params as JSON",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="Optional. When filled, these params are used instead of the fields above.",
    )

    def __init__(self, data=None, *args, user=None, **kwargs):
        self.specs = {name: workloads.spec(name) for name in workloads.available()}
        generated = {
            param_fields.field_name(workload, key): param_fields.form_field(key, param)
            for workload, spec in self.specs.items()
            for key, param in spec.params.items()
        }
        if data is not None:
            # A post that lacks a field (a script's, or one with the JSON box only) shows its
            # default again, not an empty box.
            data = {name: field.initial for name, field in generated.items()} | dict(data.items())
        super().__init__(data, *args, user=user, **kwargs)
        self.fields.update(generated)
        refused = frozenset(
            name for name, spec in self.specs.items() if spec.runs_user_code and not self.may_run_commands()
        )
        self.fields["workload"].widget = WorkloadSelect(choices=self.fields["workload"].choices)
        self.fields["workload"].widget.refused = refused
        self.fields["workload"].initial = default_workload(self.specs, refused)
        self.refused_workloads = refused
        self.params_from = "json"

    @property
    def param_groups(self) -> list[param_fields.ParamGroup]:
        return [
            param_fields.ParamGroup(
                workload=workload,
                fields=[self[param_fields.field_name(workload, key)] for key in spec.params],
                example=param_fields.example(spec),
                allowed=workload not in self.refused_workloads,
            )
            for workload, spec in self.specs.items()
        ]

    def json_box_filled(self) -> bool:
        return bool(self.is_bound and str(self.data.get("params") or "").strip())

    def clean(self):
        workload = self.cleaned_data.get("workload")
        chosen = self.specs.get(workload) if isinstance(workload, str) else None
        if chosen and "params" in self.cleaned_data and not self.json_box_filled():
            params = self.params_from_fields(workload, chosen)
            if params is None:
                del self.cleaned_data["params"]  # its fields have their errors: nothing to validate
            else:
                self.cleaned_data["params"], self.params_from = params, "fields"
        cleaned = super().clean()
        if chosen and self.params_from == "json" and "params" in cleaned and not self.has_error("params"):
            self.check_fields_agree(workload, chosen, cleaned["params"])
        return cleaned

    def params_from_fields(self, workload: str, spec: workloads.WorkloadSpec) -> dict | None:
        """The chosen workload's params as its fields give them (an empty field: the default),
        or None when a field holds no value of its type (the error is on the field)."""
        params, failed = {}, False
        for key, param in spec.params.items():
            name = param_fields.field_name(workload, key)
            text = self.cleaned_data.get(name) or ""
            if not text:
                continue
            try:
                params[key] = param_fields.read(param, text)
            except param_fields.FieldValueError as exc:
                self.add_error(name, f"{key} {exc}.")
                failed = True
        if failed:
            # Say at once what else the schema refuses, as it would with every field readable.
            try:
                clean_params(spec.params, params)
            except workloads.ParamsError as exc:
                self.add_params_errors(workload, exc, source="fields")
        elif len(json.dumps(params)) > MAX_PARAMS_BYTES:
            self.add_error(None, f"The params come to more than {MAX_PARAMS_BYTES} bytes of JSON.")
            failed = True
        return None if failed else params

    def add_params_errors(self, workload: str, exc: workloads.ParamsError, source: str = "") -> None:
        """Errors in params read from the fields go next to their fields."""
        if (source or self.params_from) == "json":
            return super().add_params_errors(workload, exc)
        for key, message in exc.errors.items():
            name = param_fields.field_name(workload, key)
            if key not in self.specs[workload].params:
                self.add_error("params", f"{key}: {message}")
            elif not self.has_error(name):  # a field its type refused is not checked again
                self.add_error(name, f"{key} {message}.")

    def check_fields_agree(self, workload: str, spec: workloads.WorkloadSpec, params: dict) -> None:
        """Refuse fields changed from their defaults that the filled JSON box contradicts: the
        JSON wins, and the user should not believe the fields were used."""
        clashes = []
        for key, param in spec.params.items():
            name = param_fields.field_name(workload, key)
            text = self.cleaned_data.get(name) or ""
            if not text:
                continue
            try:
                value = param_fields.read(param, text)
            except param_fields.FieldValueError:
                value = text  # not a value at all: it agrees with nothing
            if value == param.default or value == params.get(key):
                continue
            clashes.append(key)
            self.add_error(name, f"Params as JSON is filled, and gives {key} {json.dumps(params.get(key))}.")
        if clashes:
            self.add_error(
                "params",
                f"disagrees with the {workload} fields changed above ({', '.join(clashes)}). When filled, "
                "the JSON is used instead of the fields: empty it to use the fields, or make the two agree.",
            )
