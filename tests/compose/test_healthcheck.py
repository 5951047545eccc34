"""`manage.py healthcheck --role ROLE`, the health check of every clockq container (compose) and
the exec probe of the Kubernetes manifests: against the test session's real Redis and small
HTTP servers standing in for gunicorn and Flower."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from clockq.bus import heartbeat
from clockq.bus.client import client
from clockq.management.commands.healthcheck import local_address
from tests.harness import ROOT, free_port


def healthcheck(role: str, *, bind: str = "127.0.0.1") -> str:
    """The command's output; CommandError when it exits 1."""
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    call_command("healthcheck", role=role, bind=bind, stdout=Out())
    return "".join(lines)


def beat_as(hostname: str, gpu: int | None = None) -> None:
    heartbeat.announce(client(), {"hostname": hostname, "gpu": gpu})


@contextmanager
def answering(paths: dict[str, int]) -> Iterator[int]:
    """An HTTP server on a free loopback port that answers each path with its status (404 else)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(paths.get(self.path, 404))
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_gpu_host_is_healthy_while_one_of_its_workers_beats(settings):
    # Given gpu1@gpu-a beating, and workers of other hosts
    settings.CLOCKQ_HOST = "gpu-a"
    beat_as("gpu1@gpu-a", gpu=1)
    beat_as("gpu0@xgpu-a", gpu=0)
    beat_as("control@gpu-a")

    assert "gpu1@gpu-a" in healthcheck("gpu")

    # A host whose own GPU workers do not beat is not healthy, whoever else does
    settings.CLOCKQ_HOST = "gpu-b"
    beat_as("gpu0@gpu-b-other", gpu=0)
    with pytest.raises(CommandError, match="no GPU worker of host gpu-b"):
        healthcheck("gpu")


@pytest.mark.parametrize("role", ["control", "predictor"])
def test_a_worker_role_is_healthy_while_its_worker_beats(settings, role):
    settings.CLOCKQ_HOST = "ctl-1"
    with pytest.raises(CommandError, match=f"{role}@ctl-1 has no live heartbeat"):
        healthcheck(role)

    beat_as(f"{role}@ctl-1")

    assert healthcheck(role).strip() == f"{role}: live: {role}@ctl-1"


def test_the_web_role_is_alive_while_healthz_answers_even_503(settings):
    # 503 is /healthz saying that no GPU worker takes jobs: the web server itself serves
    for status in (200, 503):
        with answering({"/healthz": status}) as port:
            settings.PORT = port
            assert f"answered {status}" in healthcheck("web", bind="0.0.0.0")


def test_the_web_role_is_not_healthy_when_it_refuses_or_is_gone(settings):
    # A 400 is a web server that refuses this host name (ALLOWED_HOSTS): a setup to mend
    with answering({"/healthz": 400}) as port:
        settings.PORT = port
        with pytest.raises(CommandError, match="answered 400"):
            healthcheck("web")
    settings.PORT = free_port()
    with pytest.raises(CommandError, match="does not answer"):
        healthcheck("web")


def test_flower_is_healthy_when_its_healthcheck_answers(settings):
    with answering({"/healthcheck": 200}) as port:
        settings.FLOWER_PORT = port
        assert "answered 200" in healthcheck("flower")
    with answering({"/healthcheck": 500}) as port:
        settings.FLOWER_PORT = port
        with pytest.raises(CommandError, match="answered 500"):
            healthcheck("flower")


def test_beat_is_healthy_while_the_broker_answers(settings):
    assert healthcheck("beat").strip() == "beat: the broker answers"

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    client.cache_clear()
    try:
        with pytest.raises(CommandError, match="the broker does not answer"):
            healthcheck("beat")
        with pytest.raises(CommandError, match="the broker does not answer"):
            healthcheck("gpu")
    finally:
        client.cache_clear()  # the settings fixture puts the session's Redis back


def test_it_checks_every_role_of_a_list_and_names_the_one_that_fails(settings):
    settings.CLOCKQ_HOST = "h1"
    beat_as("control@h1")

    assert healthcheck("control,beat").splitlines() == ["beat: the broker answers", "control: live: control@h1"]
    with pytest.raises(CommandError, match="predictor is not healthy"):
        healthcheck("control,predictor")


def test_an_unknown_role_is_an_error():
    with pytest.raises(CommandError, match="unknown role"):
        healthcheck("webb")


@pytest.mark.parametrize(
    ("bind", "address"),
    [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "[::1]"), ("10.0.0.7", "10.0.0.7"), ("fd00::7", "[fd00::7]")],
)
def test_it_reaches_a_server_where_it_is_bound(bind, address):
    assert local_address(bind) == address


def test_its_exit_status_is_what_a_container_runtime_reads(redis_server, tmp_path):
    # Given the command run as Docker and the kubelet run it: a process of its own
    env = {**os.environ, "CLOCKQ_VAR_DIR": str(tmp_path), "SECRET_KEY": "k" * 40}

    def run(redis_url: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "manage.py", "healthcheck", "--role", "beat"]
        return subprocess.run(argv, cwd=ROOT, env={**env, "REDIS_URL": redis_url}, capture_output=True, text=True)

    alive = run(redis_server.url)
    gone = run(f"redis://127.0.0.1:{free_port()}/0")

    assert (alive.returncode, alive.stdout.strip()) == (0, "beat: the broker answers")
    assert gone.returncode == 1 and "beat is not healthy: the broker does not answer" in gone.stderr
