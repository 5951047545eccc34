"""The web form and the JSON API refuse the same hostile inputs with the same 400, naming the
field, and create nothing: both read their input through webapp.client_input."""

from __future__ import annotations

import html
import json

import pytest

from clockq.jobs.models import Job, JobEvent
from tests.helpers import post_form, token_auth

pytestmark = pytest.mark.django_db

FORM_ENCODED = "application/x-www-form-urlencoded"
DEEP = "[" * 100_000 + "]" * 100_000


def form_body(name: str = "n", tier: str = "SP", params: str = "{}", extra: str = "") -> bytes:
    """A url-encoded post as a browser sends it; the pieces are spliced in raw, already escaped."""
    return f"name={name}&tier={tier}&workload=synthetic&params={params}{extra}".encode()


def api_body(name: str = '"n"', tier: str = '"SP"', params: str = "{}", extra: str = "") -> bytes:
    """The same submission as a JSON body; the pieces are spliced in as raw JSON text."""
    return f'{{"name": {name}, "tier": {tier}, "workload": "synthetic", "params": {params}{extra}}}'.encode()


# (form body, API body, the field named, what is said of it)
CASES = {
    "nested 100,000 deep": (
        form_body(params=DEEP),
        api_body(params=DEEP),
        "params",
        "is nested deeper than 32 levels",
    ),
    "nested 33 deep, the submission included": (
        form_body(params="[" * 32 + "]" * 32),
        api_body(params="[" * 32 + "]" * 32),
        "params",
        "is nested deeper than 32 levels",
    ),
    "a lone surrogate in a key": (
        form_body(params='{"%5Cud800": 1}'),  # the JSON escape \ud800, typed into the params box
        api_body(params='{"\\ud800": 1}'),
        "params",
        "has a key that holds text that cannot be stored",
    ),
    "a lone surrogate in a value": (
        form_body(params='{"steps": "%5Cudfff"}'),
        api_body(params='{"steps": "\\udfff"}'),
        "params",
        "holds text that cannot be stored",
    ),
    "invalid UTF-8 in the name, %-escaped": (
        form_body(name="bad%FFname"),
        api_body().replace(b'"n"', b'"bad\xffname"'),
        "name",
        "holds text that cannot be stored (invalid UTF-8",
    ),
    "invalid UTF-8 in the name, a raw byte": (
        form_body().replace(b"name=n", b"name=bad\xc3name"),
        api_body().replace(b'"n"', b'"bad\xc3name"'),
        "name",
        "holds text that cannot be stored (invalid UTF-8",
    ),
    "NUL in the name": (
        form_body(name="a%00b"),
        api_body(name='"a\\u0000b"'),
        "name",
        "holds text that cannot be stored",
    ),
    "a field given twice": (
        form_body(tier="HP", extra="&tier=RT"),
        api_body(tier='"HP"', extra=', "tier": "RT"'),
        "tier",
        "is given more than once",
    ),
    "a key given twice in params": (
        form_body(params='{"steps": 1, "steps": 99999999}'),
        api_body(params='{"steps": 1, "steps": 99999999}'),
        "params",
        "holds the key 'steps' more than once",
    ),
}


def nothing_written() -> bool:
    return Job.objects.count() == 0 and JobEvent.objects.count() == 0


@pytest.mark.parametrize(("form", "api", "field", "reason"), CASES.values(), ids=CASES.keys())
def test_the_form_and_the_api_refuse_it_alike_naming_the_field(client, alice, form, api, field, reason):
    # Given alice, logged in for the form and holding a token for the API
    client.force_login(alice)
    # When she posts the same bad input both ways
    by_api = client.generic("POST", "/api/jobs", api, content_type="application/json", **token_auth(alice))
    by_form = client.generic("POST", "/jobs/new", form, content_type=FORM_ENCODED)
    # Then both answer 400 with one message naming the field, the form on its page, and create nothing
    detail = by_api.json()["detail"]
    assert by_api.status_code == 400 and detail.startswith(f"field '{field}' {reason}")
    assert by_form.status_code == 400 and "Submit a job" in by_form.content.decode()
    assert detail in html.unescape(by_form.content.decode())
    assert nothing_written()


def test_nesting_within_the_limit_is_not_refused_for_depth_by_either(client, alice):
    """The limit counts the submission around params on both ways in: params 31 deep is the most."""
    client.force_login(alice)
    params = "[" * 31 + "]" * 31
    by_api = client.generic(
        "POST", "/api/jobs", api_body(params=params), **token_auth(alice), content_type="application/json"
    )
    by_form = client.generic("POST", "/jobs/new", form_body(params=params), content_type=FORM_ENCODED)
    assert by_api.status_code == by_form.status_code == 400  # params must be an object: another refusal
    assert "nested deeper" not in json.dumps(by_api.json()) and "nested deeper" not in by_form.content.decode()
    assert nothing_written()


def test_unusual_but_valid_text_is_accepted_by_both(client, alice):
    """Non-ASCII names, a literal U+FFFD and escaped surrogate pairs are storable: not refused."""
    client.force_login(alice)
    name = "résumé ✓ \ufffd 😀"
    by_form = post_form(client, "/jobs/new", {"name": name, "tier": "SP", "workload": "synthetic", "params": "{}"})
    body = json.dumps({"name": name, "tier": "SP", "workload": "synthetic", "params": {}})  # ASCII, pairs escaped
    by_api = client.generic("POST", "/api/jobs", body, content_type="application/json", **token_auth(alice))
    assert by_form.status_code == 302 and by_api.status_code == 201
    assert list(Job.objects.values_list("name", flat=True)) == [name, name]


def test_the_form_refuses_a_multipart_post(client, alice):
    """Django decodes a multipart post's invalid UTF-8 as U+FFFD before any check can see it, and
    the form's page posts url-encoded: a multipart post is refused."""
    client.force_login(alice)
    response = client.post("/jobs/new", {"name": "n", "tier": "SP", "workload": "synthetic", "params": "{}"})
    assert response.status_code == 400 and FORM_ENCODED in response.content.decode()
    assert nothing_written()


def test_the_form_keeps_what_was_typed_after_a_refused_params(client, alice):
    """A params refused for a lone surrogate is shown again as typed (the escape), not decoded."""
    client.force_login(alice)
    typed = '{"steps": "\\udfff"}'
    response = post_form(client, "/jobs/new", {"name": "n", "tier": "SP", "workload": "synthetic", "params": typed})
    assert response.status_code == 400 and html.escape(typed) in response.content.decode()


# The page's fields for each param (webapp/param_fields.py) are read into a value and checked by
# the same schema as the API's params: each refusal names the same param with the same message,
# next to its field on the page. `command` needs its argv in both.
def _refusable() -> list[tuple[str, str, object, str]]:
    from clockq.jobs.workload_params import Int, StrList
    from clockq.jobs.workloads import SPECS

    cases = []
    for workload, spec in sorted(SPECS.items()):
        for key, param in spec.params.items():
            if isinstance(param, StrList):
                continue
            cases.append((workload, key, param.max + 1, str(param.max + 1)))  # out of range
            cases.append((workload, key, "abc", "abc"))  # not a number
            if isinstance(param, Int):
                cases.append((workload, key, 2.5, "2.5"))  # not whole
    return cases


REFUSABLE = _refusable()


def _api_post(client, user, workload: str, params: dict):
    body = json.dumps({"name": "n", "tier": "SP", "workload": workload, "params": params})
    return client.generic("POST", "/api/jobs", body, content_type="application/json", **token_auth(user))


def _form_post(client, workload: str, fields: dict):
    return post_form(client, "/jobs/new", {"name": "n", "tier": "SP", "workload": workload, **fields})


def _argv(workload: str) -> dict:
    return {"argv": ["true"]} if workload == "command" else {}


@pytest.mark.parametrize(
    ("workload", "key", "api_value", "typed"), REFUSABLE, ids=[f"{w}.{k}={t}" for w, k, _, t in REFUSABLE]
)
def test_a_param_the_api_refuses_is_refused_by_its_field_with_the_same_message(
    client, operator, workload, key, api_value, typed
):
    # Given oscar, who may run every workload, logged in and holding a token
    client.force_login(operator)
    # When he sends one bad param through the API, through the page's field, and through its JSON box
    by_api = _api_post(client, operator, workload, {**_argv(workload), key: api_value})
    fields = {f"{workload}__{key}": typed} | ({"command__argv": "true"} if workload == "command" else {})
    by_field = _form_post(client, workload, fields)
    by_box = _form_post(client, workload, {"params": json.dumps({**_argv(workload), key: api_value})})
    # Then all three refuse it with one message: on the page, next to the field, or on the box
    assert by_api.status_code == by_field.status_code == by_box.status_code == 400
    [api_error] = by_api.json()["params"]
    said = api_error["message"].removeprefix(f"{key}: ")
    field_errors = f'<ul class="errorlist" id="id_{workload}__{key}_error"><li>{key} {html.escape(said)}.</li></ul>'
    assert field_errors in by_field.content.decode()
    assert f"<li>{html.escape(api_error['message'])}</li>" in by_box.content.decode()
    assert nothing_written()


def test_the_fields_and_the_api_make_the_same_job(client, operator):
    client.force_login(operator)
    params = {"steps": 20, "batch_size": 8, "hidden": 16, "learning_rate": 0.005, "seed": 3, "dataset_examples": 0}
    assert _api_post(client, operator, "keras_train", params).status_code == 201
    fields = {f"keras_train__{key}": str(value) for key, value in params.items()}
    assert _form_post(client, "keras_train", fields).status_code == 302
    by_api, by_form = Job.objects.order_by("pk")
    assert by_api.params == by_form.params == params
