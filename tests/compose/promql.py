"""What the Prometheus and Grafana tests share: promtool, the rule files, the metric names a
PromQL expression reads, and the names clockq's /metrics really serves."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.harness import ROOT

PROMETHEUS_DIR = ROOT / "compose" / "prometheus"
GRAFANA_DASHBOARDS = ROOT / "compose" / "grafana" / "dashboards"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# Where compose mounts the metrics token; a test puts a file of its own there.
TOKEN_PATH_IN_CONFIG = "/run/secrets/clockq_metrics_token"


def needs(binary: str):
    """Skip where Debian's `prometheus` package (promtool and the server) is not installed."""
    missing = not Path(binary).is_file()
    reason = f"{binary} is missing: apt-get install prometheus (make test installs it where it may)"
    return pytest.mark.skipif(missing, reason=reason)


def rules() -> list[dict]:
    """Every rule of the rule files, recording and alerting."""
    groups = [group for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]]
    return [rule for group in groups for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


# Words of PromQL that look like metric names: operators, modifiers, grouping and literals.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left"}
KEYWORDS |= {"group_right", "inf", "nan", "atan2", "start", "end"}
STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
NAME = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric (and recording rule) names an expression selects. Grafana's `$__...` interval
    variables are read as 5m."""
    text = re.sub(r"\$__\w+", "5m", expr)
    text = STRINGS.sub('""', text)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers, their strings gone
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = GROUPING.sub(" ", text)
    names = set()
    for match in NAME.finditer(text):
        word = match.group()
        rest = text[match.end() :].lstrip()
        if word.lower() in KEYWORDS or rest.startswith("("):  # a function or an aggregation
            continue
        names.add(word)
    return names


def served_names(client, token: str) -> set[str]:
    """The sample names clockq's /metrics serves (through the Django test client), every family
    included whether or not it has samples now; and `up`, which Prometheus makes for each target."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    names = {"up"}
    for family in text_string_to_metric_families(response.content.decode()):
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel of a dashboard, those inside collapsed rows included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL) of every query of the shipped Grafana dashboards."""
    found = []
    for path in sorted(GRAFANA_DASHBOARDS.glob("*.json")):
        for panel in dashboard_panels(json.loads(path.read_text())):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((path.name, panel.get("title", ""), target["expr"]))
    return found
