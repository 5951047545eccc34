"""compose/grafana: the dashboard JSON is what compose/grafana/generate.py builds, it shows what
the operators asked for, every query parses (promtool) and reads only metrics clockq serves or
rules compose/prometheus records, and the provisioning names the data source the panels use.
Grafana itself is not installable here; the live Prometheus test runs every query."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from collections import Counter

import pytest
import yaml

from tests.compose.promql import (
    GRAFANA_DASHBOARDS,
    PROMTOOL,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    needs,
    recorded_names,
    served_names,
)
from tests.harness import ROOT

GRAFANA_DIR = ROOT / "compose" / "grafana"
TOKEN = "metrics-token-for-the-grafana-tests-012345"


def generator():
    spec = importlib.util.spec_from_file_location("clockq_grafana_generate", GRAFANA_DIR / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(GRAFANA_DASHBOARDS.glob("*.json"))}


def test_the_dashboard_json_is_what_the_generator_builds():
    built = generator()
    assert built.OUTPUT.read_text() == built.render(), "run: python compose/grafana/generate.py"
    assert list(dashboards()) == [built.OUTPUT.name]


def test_the_dashboard_shows_queues_waits_gpus_switches_load_admission_and_on_time():
    expressions = " ".join(expr for _file, _title, expr in dashboard_queries())
    for wanted in (
        "tier:clockq_queue_depth:max",  # queue depth per tier
        "tier:clockq_job_first_wait_seconds:p95_15m",  # waits per tier ...
        "tier:clockq_tier_wait_target_seconds:max",  # ... against their SLOs
        "host:clockq_gpu_utilization_ratio:avg",  # GPU utilisation per host
        "tier:clockq_slice_switches:rate5m",  # slice switches
        "clockq:load_index:max",  # the load index ...
        "clockq:load_forecast:max",  # ... with its forecast
        "clockq:admission_open:max",  # the admission state
        "tier:clockq_on_time:ratio_1h",  # on-time rate
    ):
        assert wanted in expressions, wanted


def test_every_panel_uses_the_provisioned_data_source_with_distinct_ids_and_query_names():
    provisioned = yaml.safe_load((GRAFANA_DIR / "provisioning/datasources/prometheus.yml").read_text())
    [source] = provisioned["datasources"]
    assert source["type"] == "prometheus"
    for name, board in dashboards().items():
        panels = dashboard_panels(board)
        assert len({p["id"] for p in panels}) == len(panels), name
        for panel in panels:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
            assert panel["targets"], panel["title"]
            ref_ids = Counter(t["refId"] for t in panel["targets"])
            assert all(ref_ids.values()) and max(ref_ids.values()) == 1, (panel["title"], ref_ids)


def test_the_dashboard_provider_loads_the_dashboards_folder():
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning/dashboards/clockq.yml").read_text())
    [clockq] = provider["providers"]
    assert clockq["type"] == "file" and clockq["options"]["path"].endswith("/clockq")


@needs(PROMTOOL)
def test_every_query_parses(tmp_path):
    # promtool parses each expression as the expression of a recording rule
    rules = [
        {"record": f"grafana:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, (_file, _title, expr) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}))

    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout


@pytest.mark.django_db
def test_every_query_reads_only_metrics_clockq_serves_or_rules_it_records(client, settings):
    settings.CLOCKQ_METRICS_TOKEN = TOKEN
    known = served_names(client, TOKEN) | recorded_names()
    unknown = {(title, expr): metric_names(expr) - known for _file, title, expr in dashboard_queries()}
    assert {key: names for key, names in unknown.items() if names} == {}
