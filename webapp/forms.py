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

from clockq.jobs import client_input, quotas, workloads
from clockq.policy.tiers import TIER_CODES

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
    tier = forms.ChoiceField(choices=[(c, c) for c in TIER_CODES], initial="SP")
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
        }

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
                self.add_error("params", "; ".join(f"{k}: {v}" for k, v in exc.errors.items()))
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
