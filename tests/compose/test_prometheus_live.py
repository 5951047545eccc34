"""The real Prometheus server against a live clockq: gunicorn serving the web role (on the test
database and the private Redis) and Flower, scraped with the shipped config (compose/prometheus)
and its rules. The queue depth, the load index and the forecast come back through Prometheus's
query API, every rule evaluates without error, and so does every Grafana panel's query."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import yaml
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.control_state.control import apply_forecast
from clockq.forecasting.models import MetricSample
from clockq.stack.roles import web_argv
from tests.compose.promql import PROMETHEUS, PROMETHEUS_DIR, dashboard_queries, needs
from tests.harness import ROOT, FlowerServer, Service, free_port, wait_for
from tests.helpers import database_url, submit

pytestmark = [pytest.mark.integration, needs(PROMETHEUS), pytest.mark.django_db(transaction=True)]

TOKEN = "metrics-token-for-the-live-prometheus-test-0123"


def _answers(service: Service, url: str, **headers: str):
    def check() -> bool:
        service.check_alive()
        try:
            return requests.get(url, headers=headers, timeout=5).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not up yet, or a cold first answer on a loaded machine
            return False

    return check


@pytest.fixture
def web(redis_server, settings, tmp_path):
    """gunicorn as the web role runs it, with a metrics token; its port."""
    port = free_port()
    settings.CLOCKQ_CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_server.url,
        "CLOCKQ_METRICS_TOKEN": TOKEN,
        "CLOCKQ_CHECKPOINT_DIR": str(settings.CLOCKQ_CHECKPOINT_DIR),
    }
    service = Service("gunicorn", web_argv("127.0.0.1", port), env, ROOT, tmp_path / "gunicorn.log").start()
    try:
        answers = _answers(service, f"http://127.0.0.1:{port}/metrics", Authorization=f"Bearer {TOKEN}")
        wait_for(answers, 60, interval=0.2, what="gunicorn to serve /metrics")
        yield port
    finally:
        service.stop()
        print(f"--- gunicorn (tail) ---\n{service.tail()}")


@pytest.fixture
def flower(redis_server, tmp_path):
    server = FlowerServer({"admin": "admin-pass-123"}, tmp_path / "flower.log").start(redis_server.url)
    yield server
    server.stop()


def prometheus_config(tmp_path: Path, web_port: int, flower_port: int, own_port: int) -> Path:
    """The shipped prometheus.yml with this machine's targets, the test's token file and the
    shipped rules, scraping and evaluating every second."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR / rule_glob) for rule_glob in config["rule_files"]]
    token_file = tmp_path / "metrics-token"
    token_file.write_text(TOKEN)
    targets = {"clockq": web_port, "flower": flower_port, "prometheus": own_port}
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{targets[job['job_name']]}"]}]
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token_file)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def prometheus(web, flower, tmp_path):
    """The Prometheus server (Debian's) on a free port; its query API's base URL."""
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={prometheus_config(tmp_path, web, flower.port, port)}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    service = Service("prometheus", argv, dict(os.environ), tmp_path, tmp_path / "prometheus.log").start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(_answers(service, f"{base}/-/ready"), 60, interval=0.2, what="Prometheus to be ready")
        yield base
    finally:
        service.stop()
        print(f"--- prometheus (tail) ---\n{service.tail()}")


def query(base: str, promql: str) -> dict:
    response = requests.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (promql, body)
    return body["data"]


def value_of(base: str, promql: str) -> float | None:
    """The single sample's value of an instant query, None while it has none."""
    result = query(base, promql)["result"]
    return float(result[0]["value"][1]) if len(result) == 1 else None


def wait_value(base: str, promql: str, expected: float) -> None:
    """Poll the query API until the scrapes (and rule evaluations) have brought `expected`."""
    seen: list[float | None] = []

    def arrived() -> bool:
        seen.append(value_of(base, promql))
        return seen[-1] is not None and abs(seen[-1] - expected) < 1e-9

    try:
        wait_for(arrived, 60, interval=0.2, what=f"{promql} == {expected}")
    except TimeoutError:
        raise AssertionError(f"{promql}: expected {expected}, last read {seen[-1:]}") from None


def test_prometheus_scrapes_clockq_and_reads_the_queue_the_load_and_the_forecast(prometheus, alice, settings):
    # Given 3 SP jobs and 1 HP job waiting, a load sample and a forecast
    for name, tier in (("a", "SP"), ("b", "SP"), ("c", "SP"), ("d", "HP")):
        submit(alice, tier, name)
    now = timezone.now()
    MetricSample.objects.create(at=now - timedelta(seconds=30), load_index=0.75, gpus=2)
    apply_forecast(0.91, at=now, workers=2)

    # Then Prometheus reads them back through its query API, as scraped
    wait_value(prometheus, 'clockq_queue_depth{job="clockq",tier="SP"}', 3)
    wait_value(prometheus, 'clockq_queue_depth{job="clockq",tier="HP"}', 1)
    wait_value(prometheus, 'clockq_load_index{job="clockq"}', 0.75)
    wait_value(prometheus, 'clockq_load_forecast{job="clockq"}', 0.91)
    wait_value(prometheus, 'clockq_admission_open{job="clockq"}', 0)  # 0.91 is over 85%
    # ... and as the recording rules keep them
    wait_value(prometheus, 'tier:clockq_queue_depth:max{tier="SP"}', 3)
    wait_value(prometheus, "clockq:load_forecast:max", 0.91)
    wait_value(prometheus, 'tier:clockq_tier_wait_target_seconds:max{tier="HP"}', 60)
    # A live GPU worker's heartbeat (it lasts 15 s) shows as its own series
    host = socket.gethostname()
    heartbeat.announce(broker(), {"hostname": f"gpu0@{host}", "gpu": 0})
    wait_value(prometheus, f'host:clockq_gpu_workers_up:count{{host="{host}"}}', 1)
    # Both targets are up: the token got in, and Flower answers without one
    wait_value(prometheus, 'up{job="clockq"}', 1)
    wait_value(prometheus, 'up{job="flower"}', 1)


def test_every_rule_and_every_grafana_query_evaluates_on_the_live_server(prometheus, alice):
    submit(alice, "SP", "waiting")
    wait_value(prometheus, 'clockq_queue_depth{job="clockq",tier="SP"}', 1)

    # Every rule has been evaluated, and none failed (a bad vector match, say, fails only here)
    def all_evaluated() -> list[dict] | None:
        groups = requests.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        found = [rule for group in groups for rule in group["rules"]]
        return found if found and all(rule["health"] != "unknown" for rule in found) else None

    evaluated = wait_for(all_evaluated, 60, interval=0.2, what="every rule to be evaluated")
    assert {r["name"]: r.get("lastError", "") for r in evaluated if r["health"] != "ok"} == {}
    assert len(evaluated) == sum(len(g["rules"]) for g in _rule_groups())

    # Every Grafana panel's query runs (Grafana's interval variables as Grafana would fill them)
    expressions = [expr for _dashboard, _panel, expr in dashboard_queries()]
    assert expressions, "no dashboard queries found"
    for expr in expressions:
        query(prometheus, expr.replace("$__rate_interval", "1m").replace("$__interval", "15s"))


def _rule_groups() -> list[dict]:
    paths = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
    return [group for path in paths for group in yaml.safe_load(path.read_text())["groups"]]
