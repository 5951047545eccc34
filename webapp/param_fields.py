"""The submit page's fields for workload params, generated from each workload's schema
(clockq.jobs.workload_params), so that a new workload gets its fields with no HTML of its own.

Every field is text until the form reads it: only the chosen workload's fields are read, so a
value left in another workload's fields can make no error. A field is read into the value its
JSON would hold (a number, a list of lines), and the schema then checks it exactly as it checks
the API's params: the same bounds, the same messages."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import forms
from django.utils.html import format_html

from clockq.jobs.workload_params import Float, Int, StrList
from clockq.jobs.workloads import WorkloadSpec

ParamSpec = Int | Float | StrList

# A list param with no default still gets an example in the JSON the page shows (a number
# without one shows its least value).
LIST_EXAMPLE = ["python3", "train.py"]


def field_name(workload: str, param: str) -> str:
    """The name a param's field is posted under: one per workload, as two may share a param."""
    return f"{workload}__{param}"


def _number_text(value: float) -> str:
    """A bound or default as HTML's number input reads it: "20" for 20.0, "1e-06" as it is."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return str(value) if isinstance(value, int) else repr(value)


def _shown(value: float) -> str:
    """A bound or default as a person reads it: 10,000,000 and 0.001, not 10000000 and 1e-03."""
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def initial_text(spec: ParamSpec) -> str:
    """What a param's field holds before anything is typed: its default, or nothing."""
    if spec.default is None:
        return ""
    if isinstance(spec, StrList):
        return "\n".join(spec.default)
    return _number_text(spec.default)


def _help(spec: ParamSpec) -> str:
    if isinstance(spec, StrList):
        facts = f"one per line, at most {spec.max_items}"
        facts += " (required)" if spec.default is None else ", empty for the default"
    else:
        facts = f"{_shown(spec.min)} to {_shown(spec.max)}"
        if spec.default is not None:
            facts += f", default {_shown(spec.default)}"
    return format_html("{}{}{}", spec.help, "; " if spec.help else "", facts)


def form_field(name: str, spec: ParamSpec) -> forms.Field:
    """The field for one param: a number input with the schema's bounds, or a box of lines."""
    if isinstance(spec, StrList):
        widget: forms.Widget = forms.Textarea(attrs={"rows": 3, "spellcheck": "false"})
    else:
        step = "1" if isinstance(spec, Int) else "any"
        widget = forms.NumberInput(attrs={"min": _number_text(spec.min), "max": _number_text(spec.max), "step": step})
    widget.attrs["data-param"] = name
    # Not required, and read only in the form's clean: an empty field means the param's default.
    return forms.CharField(
        label=name, required=False, strip=True, initial=initial_text(spec), help_text=_help(spec), widget=widget
    )


class FieldValueError(ValueError):
    pass


def read(spec: ParamSpec, text: str) -> Any:
    """The JSON value a field's text stands for, for the schema to check; FieldValueError when
    the text is no such value. The bounds are the schema's to check, not this."""
    if isinstance(spec, StrList):
        return [line.strip() for line in text.splitlines() if line.strip()]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise FieldValueError("must be a whole number" if isinstance(spec, Int) else "must be a number") from None
    if isinstance(spec, Int) and not value.is_integer():
        raise FieldValueError("must be a whole number")
    return value


def example(spec: WorkloadSpec) -> str:
    """The workload's params as JSON, each at its default: a template for the JSON box."""
    return json.dumps({key: _example_value(param) for key, param in spec.params.items()})


def _example_value(param: ParamSpec) -> Any:
    if param.default is not None:
        return param.default
    return LIST_EXAMPLE if isinstance(param, StrList) else param.min


@dataclass(frozen=True)
class ParamGroup:
    """One workload's fields on the page, in the order its schema lists them."""

    workload: str
    fields: list  # its bound fields
    example: str
    allowed: bool  # whether this user may submit it
