"""The submit page's form, generated from each workload's params schema: a field per param with
its type, default, bounds and help; the chosen workload's fields read, errors next to them; the
JSON box used instead when filled; a first workload the user may run."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from clockq.jobs import workloads
from clockq.jobs.models import Job
from clockq.jobs.workload_params import Float, Int, StrList
from tests.helpers import post_form
from webapp.forms import WebJobForm, default_workload

pytestmark = pytest.mark.django_db

ALL_PARAMS = [(name, key) for name, spec in workloads.SPECS.items() for key in spec.params]


class Page(HTMLParser):
    """What a test reads of a page: each named control's tag and attributes, each fieldset's
    workload and the names inside it, the workload options, the error lists and what follows."""

    def __init__(self, html: str):
        super().__init__()
        self.controls: dict[str, dict] = {}
        self.fieldsets: dict[str, list[str]] = {}
        self.options: dict[str, dict] = {}
        self.text_of: dict[str, str] = {}  # a textarea's or an error list's text, by its name or id
        self._fieldset: str | None = None
        self._open: str | None = None
        self.html = html
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "fieldset" and "data-workload" in attrs:
            self._fieldset = attrs["data-workload"]
            self.fieldsets[self._fieldset] = []
        elif tag in ("input", "textarea", "select") and "name" in attrs:
            self.controls[attrs["name"]] = {"tag": tag, **attrs}
            if self._fieldset:
                self.fieldsets[self._fieldset].append(attrs["name"])
            if tag == "textarea":
                self._open, self.text_of[attrs["name"]] = attrs["name"], ""
        elif tag == "option":
            self.options[attrs["value"]] = attrs
        elif tag == "ul" and "errorlist" in attrs.get("class", "") and attrs.get("id"):
            self._open, self.text_of[attrs["id"]] = attrs["id"], ""

    def handle_endtag(self, tag):
        if tag == "fieldset":
            self._fieldset = None
        elif tag in ("textarea", "ul"):
            self._open = None

    def handle_data(self, data):
        if self._open:
            self.text_of[self._open] += data


def the_page(client, user) -> Page:
    client.force_login(user)
    response = client.get("/jobs/new")
    assert response.status_code == 200
    return Page(response.content.decode())


def submitted(client, user, data: dict, status: int = 400) -> Page:
    client.force_login(user)
    response = post_form(client, "/jobs/new", {"name": "n", "tier": "SP", **data})
    assert response.status_code == status, response.content.decode()[-2000:]
    return Page(response.content.decode()) if status == 400 else response


@pytest.mark.parametrize(("workload", "key"), ALL_PARAMS, ids=[f"{w}.{k}" for w, k in ALL_PARAMS])
def test_each_param_gets_a_field_of_its_type_with_its_default_bounds_and_help(client, operator, workload, key):
    param = workloads.SPECS[workload].params[key]
    control = the_page(client, operator).controls[f"{workload}__{key}"]
    form = WebJobForm(user=operator)
    help_text = str(form[f"{workload}__{key}"].help_text)
    if isinstance(param, StrList):
        assert control["tag"] == "textarea" and "one per line" in help_text
    else:
        assert (control["tag"], control["type"]) == ("input", "number")
        assert float(control["min"]) == param.min and float(control["max"]) == param.max
        assert control["step"] == ("1" if isinstance(param, Int) else "any")
        assert float(control["value"]) == param.default
        assert f"default {param.default:g}" in help_text.replace(",", "")
        assert isinstance(param, Int | Float)
    assert param.help in help_text


def test_each_workload_has_a_fieldset_of_its_params_in_schema_order(client, operator):
    page = the_page(client, operator)
    assert page.fieldsets == {
        name: [f"{name}__{key}" for key in spec.params] for name, spec in sorted(workloads.SPECS.items())
    }


def test_a_new_workload_gets_its_fields_from_its_schema_alone(client, alice, settings, monkeypatch):
    # Given a workload that exists only as a spec and a line in the setting
    spec = workloads.WorkloadSpec("tiny", {"rounds": Int(1, 9, default=3, help="how many"), "p": Float(0.5, 2.0)})
    monkeypatch.setitem(workloads.SPECS, "tiny", spec)
    settings.CLOCKQ_WORKLOADS = {**settings.CLOCKQ_WORKLOADS, "tiny": "nowhere.Tiny"}
    # Then the page has its fields, and a post through them is checked by its schema
    page = the_page(client, alice)
    assert page.fieldsets["tiny"] == ["tiny__rounds", "tiny__p"]
    assert (page.controls["tiny__rounds"]["max"], page.controls["tiny__p"]["step"]) == ("9", "any")
    assert "As JSON, for the box below: <code>{&quot;rounds&quot;: 3, &quot;p&quot;: 0.5}</code>" in page.html
    refused = submitted(client, alice, {"workload": "tiny", "tiny__rounds": "4"})
    assert refused.text_of["id_tiny__p_error"] == "p is required."
    assert Job.objects.count() == 0


def test_a_user_without_the_permission_is_offered_a_workload_they_may_run(client, alice):
    page = the_page(client, alice)
    assert "selected" in page.options["keras_train"]
    assert "disabled" in page.options["command"] and "selected" not in page.options["command"]
    assert "command" not in page.fieldsets  # no fields for what cannot be chosen
    assert set(page.fieldsets) == {"keras_train", "matmul", "synthetic"}


def test_a_user_with_the_permission_may_pick_command_but_does_not_get_it_first(client, operator):
    page = the_page(client, operator)
    assert "selected" in page.options["keras_train"]
    assert "disabled" not in page.options["command"] and "command" in page.fieldsets


@pytest.mark.parametrize(
    ("refused", "first"),
    [
        (frozenset(), "keras_train"),  # never the one that needs a program typed in
        (frozenset({"command"}), "keras_train"),
    ],
)
def test_the_first_workload_offered(refused, first):
    specs = {name: workloads.SPECS[name] for name in workloads.available()}
    assert default_workload(specs, refused) == first


def test_command_is_first_only_where_it_is_the_only_one_allowed():
    only = {"command": workloads.SPECS["command"]}
    assert default_workload(only, frozenset()) == "command"


def test_the_fields_submit_a_job_with_no_json_typed(client, alice):
    # Given alice, who types nothing but a name, and keeps keras_train's defaults
    response = submitted(client, alice, {"workload": "keras_train", "params": ""}, status=302)
    job = Job.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job.workload == "keras_train"
    assert job.params == {key: param.default for key, param in workloads.SPECS["keras_train"].params.items()}


def test_the_chosen_workloads_fields_are_read_and_the_others_ignored(client, alice):
    data = {"workload": "matmul", "matmul__size": "64", "matmul__steps": "10", "synthetic__steps": "not a number"}
    submitted(client, alice, data, status=302)
    assert Job.objects.get().params == {"size": 64, "steps": 10}


def test_an_emptied_field_means_the_default_and_a_float_field_takes_exponents(client, alice):
    data = {"workload": "keras_train", "keras_train__steps": "", "keras_train__learning_rate": "2e-4"}
    submitted(client, alice, data, status=302)
    params = Job.objects.get().params
    assert (params["steps"], params["learning_rate"]) == (200, 2e-4)


def test_out_of_range_and_wrong_type_errors_sit_next_to_their_fields(client, alice):
    page = submitted(client, alice, {"workload": "matmul", "matmul__size": "99999", "matmul__steps": "2.5"})
    assert page.text_of["id_matmul__size_error"] == "size must be between 2 and 4096."
    assert page.text_of["id_matmul__steps_error"] == "steps must be a whole number."
    control = page.controls["matmul__size"]
    assert control["aria-invalid"] == "true" and "id_matmul__size_error" in control["aria-describedby"]
    assert "id_params_error" not in page.text_of  # not one blob at the top, nor in the JSON box
    assert Job.objects.count() == 0


def test_nothing_typed_is_lost_on_a_refusal(client, alice):
    data = {
        "name": "kept",
        "workload": "matmul",
        "matmul__size": "99999",
        "matmul__steps": "12",
        "synthetic__steps": "77",  # another workload's field, typed before switching
        "deadline": "2030-01-31T18:00:00Z",
    }
    page = submitted(client, alice, data)
    assert page.controls["name"]["value"] == "kept"
    values = {name: page.controls[name]["value"] for name in ("matmul__size", "matmul__steps", "synthetic__steps")}
    assert values == {"matmul__size": "99999", "matmul__steps": "12", "synthetic__steps": "77"}
    assert page.controls["synthetic__step_ms"]["value"] == "10"  # not posted: its default again
    assert "selected" in page.options["matmul"]


def test_argv_is_typed_one_item_a_line(client, operator):
    typed = {"workload": "command", "command__argv": "python3\r\n-c\r\nprint(1)\r\n", "command__step_ms": "5"}
    submitted(client, operator, typed, status=302)
    assert Job.objects.get().params == {"argv": ["python3", "-c", "print(1)"], "step_ms": 5.0}


def test_a_command_with_no_program_is_refused_next_to_argv(client, operator):
    page = submitted(client, operator, {"workload": "command", "command__argv": "  \n"})
    assert page.text_of["id_command__argv_error"] == "argv is required."


def test_a_user_without_the_permission_cannot_post_command_through_its_fields(client, alice):
    page = submitted(client, alice, {"workload": "command", "command__argv": "ls"})
    assert "needs the 'run command' permission" in page.text_of["id_workload_error"]
    assert Job.objects.count() == 0


def test_the_json_box_when_filled_is_used_instead_of_the_fields(client, alice):
    # The fields still hold their defaults (as a page posts them): the JSON's params are used.
    data = {"workload": "matmul", "matmul__size": "256", "matmul__steps": "200", "params": '{"size": 8}'}
    submitted(client, alice, data, status=302)
    assert Job.objects.get().params == {"size": 8, "steps": 200}


def test_a_changed_field_that_agrees_with_the_json_is_accepted(client, alice):
    data = {"workload": "matmul", "matmul__size": "8", "params": '{"size": 8, "steps": 3}'}
    submitted(client, alice, data, status=302)
    assert Job.objects.get().params == {"size": 8, "steps": 3}


def test_a_changed_field_that_the_json_contradicts_is_refused_naming_both(client, alice):
    typed = '{"steps": 3}'
    data = {"workload": "matmul", "matmul__size": "8", "matmul__steps": "200", "params": typed}
    page = submitted(client, alice, data)
    assert page.text_of["id_matmul__size_error"] == "Params as JSON is filled, and gives size 256."
    assert page.text_of["id_params_error"].startswith("disagrees with the matmul fields changed above (size).")
    assert "empty it to use the fields" in page.text_of["id_params_error"]
    assert "id_matmul__steps_error" not in page.text_of  # unchanged: its default
    assert page.text_of["params"].strip() == typed and page.controls["matmul__size"]["value"] == "8"
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ('{"size": 99999}', "size: must be between 2 and 4096"),
        ('{"size": "big"}', "size: must be a whole number"),
        ('{"sise": 64}', "sise: unknown param; allowed: size, steps"),
        ("[1, 2]", "params: must be a JSON object"),
        ("{oops", "is not valid JSON"),
    ],
)
def test_the_json_box_gets_clear_errors_and_keeps_its_text(client, alice, typed, error):
    page = submitted(client, alice, {"workload": "matmul", "params": typed})
    assert error in page.text_of["id_params_error"]
    assert page.text_of["params"].strip() == typed
    assert Job.objects.count() == 0


def test_the_page_shows_each_workloads_json_template_above_the_submit_button(client, alice):
    client.force_login(alice)
    html = client.get("/jobs/new").content.decode()
    example = html.index("{&quot;size&quot;: 256, &quot;steps&quot;: 200}")
    assert example < html.index('<button type="submit">')
    assert html.index('<details id="params-json">') < html.index('<button type="submit">')
