"""compose/prometheus: the config and rules pass promtool's checks, every alert has a unit test
that makes it fire (promtool test rules), and every rule reads only metrics that clockq's
/metrics serves or that another rule records."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.compose.promql import (
    PROMETHEUS_DIR,
    PROMTOOL,
    RULE_FILES,
    TOKEN_PATH_IN_CONFIG,
    metric_names,
    needs,
    recorded_names,
    rules,
    served_names,
)

TOKEN = "metrics-token-for-the-prometheus-tests-0123"


def promtool(*args: str, cwd=PROMETHEUS_DIR) -> str:
    done = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@needs(PROMTOOL)
def test_the_config_passes_promtool_with_its_rule_files(tmp_path):
    # Given the shipped folder, with a token file where compose mounts the secret
    shutil.copytree(PROMETHEUS_DIR, tmp_path / "prometheus")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    config = tmp_path / "prometheus" / "prometheus.yml"
    text = config.read_text()
    assert text.count(TOKEN_PATH_IN_CONFIG) == 1
    config.write_text(text.replace(TOKEN_PATH_IN_CONFIG, str(token_file)))

    out = promtool("check", "config", str(config), cwd=tmp_path / "prometheus")

    assert "SUCCESS" in out and f"{len(RULE_FILES)} rule files found" in out


def test_the_config_scrapes_the_web_role_with_the_token_and_flower():
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["clockq"]["metrics_path"] == "/metrics"
    assert jobs["clockq"]["authorization"] == {"type": "Bearer", "credentials_file": TOKEN_PATH_IN_CONFIG}
    assert jobs["flower"]["metrics_path"] == "/metrics" and "authorization" not in jobs["flower"]
    assert config["rule_files"] == ["rules/*.yml"]


@needs(PROMTOOL)
def test_the_rules_pass_promtool():
    out = promtool("check", "rules", *(str(p) for p in RULE_FILES))
    assert out.count("SUCCESS") == len(RULE_FILES)


@needs(PROMTOOL)
def test_every_alert_fires_in_a_unit_test_and_the_unit_tests_pass():
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    unit_tests = yaml.safe_load((PROMETHEUS_DIR / "tests" / "alerts_test.yml").read_text())
    fired = {
        case["alertname"]
        for test in unit_tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == alerts
    assert {"ClockqTierWaitsOverSlo", "ClockqAdmissionClosedLong", "ClockqGpuWorkerMissing"} <= alerts
    assert {"ClockqForecastStale", "ClockqCheckpointDiskNearlyFull", "ClockqBeatMissing"} <= alerts

    out = promtool("test", "rules", str(PROMETHEUS_DIR / "tests" / "alerts_test.yml"))

    assert "SUCCESS" in out


@pytest.mark.django_db
def test_every_rule_reads_only_metrics_that_clockq_serves_or_a_rule_records(client, settings):
    settings.CLOCKQ_METRICS_TOKEN = TOKEN
    known = served_names(client, TOKEN) | recorded_names()
    unknown = {rule.get("record") or rule["alert"]: metric_names(rule["expr"]) - known for rule in rules()}
    assert {name: names for name, names in unknown.items() if names} == {}


def test_the_promql_reader_finds_the_metric_names_and_nothing_else():
    expr = (
        'sum by (tier) (rate(clockq_slices_total{outcome="yielded", tier=~"a|b"}[$__rate_interval] offset 5m))'
        " / on (tier) group_left tier:clockq_x:max > bool 0.5e3 unless time() - clockq_y > 1"
    )
    assert metric_names(expr) == {"clockq_slices_total", "tier:clockq_x:max", "clockq_y"}
