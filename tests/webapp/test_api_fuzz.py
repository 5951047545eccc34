"""Fuzzing: schemathesis reads the API's own OpenAPI schema from GET /api/schema on a
live server, generates requests for every operation in it, valid ones and invalid ones, and sends
them over HTTP with a real API token. No answer may be a 5xx, and every answer must be one the
schema documents (status code, content type and body).

Bounded and reproducible: derandomized generation, no example database, MAX_EXAMPLES requests
per operation and mode. (schemathesis.pytest.from_fixture, the usual way to fuzz a server that a
fixture starts, fails on this pytest (9.2): it sets `Function._nodeid`, which is gone. So
each operation runs as a plain Hypothesis test over `APIOperation.as_strategy`.)"""

from __future__ import annotations

import pytest
import requests
import schemathesis
import yaml
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from knox.models import AuthToken
from schemathesis import GenerationMode, checks

from clockq.jobs.models import Job
from clockq.jobs.results import ResultStore
from tests.helpers import submit

# (method, path, whether it takes input): invalid requests are generated only for those that
# take some (a query, a body or a path parameter); the others have nothing to get wrong.
OPERATIONS = [
    ("GET", "/api/jobs", True),
    ("POST", "/api/jobs", True),
    ("GET", "/api/jobs/{job_id}", True),
    ("POST", "/api/jobs/{job_id}/cancel", True),
    ("POST", "/api/jobs/{job_id}/promote", True),
    ("GET", "/api/jobs/{job_id}/result", True),
    ("GET", "/api/jobs/{job_id}/metrics", True),
    ("GET", "/api/jobs/{job_id}/result/{name}", True),
    ("GET", "/api/queues", False),
    ("GET", "/api/gpus", False),
    ("GET", "/api/kpis", True),
    ("GET", "/api/hosts", False),
    ("GET", "/api/hosts/{host}", True),
    ("POST", "/api/hosts/{host}/drain", True),
    ("POST", "/api/hosts/{host}/resume", True),
    ("GET", "/api/workers/{name}", True),
    ("POST", "/api/workers/{name}/drain", True),
    ("POST", "/api/workers/{name}/resume", True),
]
# Requests tried first, besides the generated ones: edges that random generation rarely hits.
EDGE_BODIES = {
    ("POST", "/api/jobs"): [
        # The latest deadline there is, and one a minute later in UTC: a valid ISO 8601 time
        # that Python can hold but not convert to UTC (SQLite stores naive UTC).
        {"name": "edge", "tier": "SP", "workload": "synthetic", "deadline": "9999-12-31T23:59:59.999999Z"},
        {"name": "edge", "tier": "SP", "workload": "synthetic", "deadline": "9999-12-31T23:59:00-00:01"},
        {"name": "edge", "tier": "BK", "workload": "matmul", "params": {}, "gpu_mem_mib": 4194304},
    ],
}
RUNS = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode}")
    for method, path, takes_input in OPERATIONS
    for mode in [GenerationMode.POSITIVE, *([GenerationMode.NEGATIVE] if takes_input else [])]
]
MAX_EXAMPLES = 40

# Any 5xx fails; so does an answer the schema does not describe. `positive_data_acceptance` is
# left out on purpose: a request that matches the schema may still be refused for reasons that a
# schema cannot say (a job that does not exist or is another user's, a deadline in the past,
# params that the named workload does not take).
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


def _succeed_with_a_result(job, settings) -> None:
    """The job succeeded and stored `state.bin`, the file the schema gives as its example name,
    so that generated requests reach a result and its file, not only 404s."""
    results = ResultStore(settings.CLOCKQ_CHECKPOINT_DIR)
    staged = results.staging(job.pk)
    (staged / "state.bin").write_bytes(b"state")
    manifest = results.store(job.pk, staged)
    Job.objects.filter(pk=job.pk).update(
        state="succeeded", finished_at=timezone.now(), result_files=manifest.as_json(),
        result_bytes=manifest.total_bytes, result_stored_at=timezone.now(),
    )  # fmt: skip


@pytest.fixture
def api_schema(live_server, alice, bob, settings):
    """The schema as served, set to call the live server as alice, with a few jobs to find:
    reset_sequences makes their ids 1..4, which generated `job_id`s hit now and then. The first
    has a result."""
    jobs = [submit(alice, name=name) for name in ("one", "two", "three")]
    submit(bob, name="not-alices")
    _succeed_with_a_result(jobs[0], settings)
    _instance, token = AuthToken.objects.create(user=alice)
    config = schemathesis.Config.from_dict(
        {
            "base-url": live_server.url,
            "headers": {"Authorization": f"Token {token}"},
            "request-timeout": 10,
        }
    )
    return schemathesis.openapi.from_url(f"{live_server.url}/api/schema", config=config, timeout=10)


@pytest.mark.django_db(transaction=True, reset_sequences=True)
@pytest.mark.parametrize(("method", "path", "mode"), RUNS)
def test_no_generated_request_gets_a_server_error(api_schema, method, path, mode):
    operation = api_schema[path][method]

    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case):
        case.call_and_validate(checks=CHECKS)

    if mode is GenerationMode.POSITIVE:
        for body in EDGE_BODIES.get((method, path), []):
            edge = operation.Case(body=body, media_type="application/json", headers=api_schema.config.headers)
            check = example(case=edge)(check)
    check()  # on a 500, the live server's traceback is in the captured log


@pytest.mark.django_db(transaction=True)
def test_the_schema_is_public_and_lists_every_operation(live_server):
    response = requests.get(f"{live_server.url}/api/schema", timeout=10)
    assert response.status_code == 200
    document = yaml.safe_load(response.text)
    assert document["openapi"].startswith("3.")
    listed = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    assert listed == {(method, path) for method, path, _ in OPERATIONS}  # the fuzz test covers every one
    # One job or a batch, and the answer in kind.
    post = document["paths"]["/api/jobs"]["post"]
    submitted = post["requestBody"]["content"]["application/json"]["schema"]
    assert submitted == {"$ref": "#/components/schemas/JobSubmitOneOrBatch"}
    one_or_batch = document["components"]["schemas"]["JobSubmitOneOrBatch"]["oneOf"]
    assert one_or_batch == [
        {"$ref": "#/components/schemas/JobSubmit"},
        {"type": "array", "items": {"$ref": "#/components/schemas/JobSubmit"}},
    ]
    created = post["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    assert document["components"]["schemas"][created.rsplit("/", 1)[1]]["oneOf"][1]["type"] == "array"
    submit_schema = document["components"]["schemas"]["JobSubmit"]
    assert submit_schema["discriminator"]["propertyName"] == "workload"
    assert set(submit_schema["discriminator"]["mapping"]) == {"synthetic", "matmul", "keras_train", "command"}
    # HTTP basic auth is off by default, so the schema does not offer it.
    assert "basicAuth" not in document["components"]["securitySchemes"]
    operations = [op for item in document["paths"].values() for op in item.values()]
    assert not [op for op in operations if any("basicAuth" in r for r in op.get("security", []))]
    # The promote body is closed: a tier code, or nothing.
    promote = document["paths"]["/api/jobs/{job_id}/promote"]["post"]["requestBody"]["content"]
    assert promote["application/json"]["schema"]["additionalProperties"] is False
    # A stale token sent along does not turn the public schema into a 401.
    stale = requests.get(f"{live_server.url}/api/schema?format=json", headers={"Authorization": "Token x"}, timeout=10)
    assert stale.status_code == 200 and stale.json()["paths"].keys() == document["paths"].keys()


@pytest.mark.django_db(transaction=True)
def test_the_schema_offers_basic_auth_only_where_it_is_on(live_server, settings):
    settings.CLOCKQ_API_BASIC_AUTH = True
    document = requests.get(f"{live_server.url}/api/schema?format=json", timeout=10).json()
    assert document["components"]["securitySchemes"]["basicAuth"]["scheme"] == "basic"
    assert {"basicAuth": []} in document["paths"]["/api/jobs"]["get"]["security"]


def test_the_schema_is_made_without_warnings_and_validates(tmp_path):
    # drf-spectacular's own check: every view described, no guessed types, no clashing operation
    # ids, and the document valid against the OpenAPI 3 schema.
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert yaml.safe_load((tmp_path / "schema.yaml").read_text())["paths"]
