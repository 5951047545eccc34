"""What `make run` does to the files it keeps under var/."""

from __future__ import annotations

import os
import stat

import pytest

from clockq.management.commands.runstack import _without_password, protect_var_dir


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def keep_umask():
    saved = os.umask(0o022)
    os.umask(saved)
    yield
    os.umask(saved)


def test_var_files_become_private_and_the_folder_unlistable(tmp_path, keep_umask):
    var = tmp_path / "var"
    (var / "redis").mkdir(parents=True)
    (var / "clockq.sqlite3").write_text("db")
    (var / "clockq.sqlite3").chmod(0o644)
    (var / "redis" / "appendonly.aof").write_text("aof")
    protect_var_dir(var)
    assert mode(var) == 0o711 and mode(var / "redis") == 0o700
    assert mode(var / "clockq.sqlite3") == 0o600
    (var / "new-file").write_text("x")  # the umask now covers new files too
    assert mode(var / "new-file") == 0o600


def test_the_banner_never_shows_the_broker_password():
    assert _without_password("redis://:hunter2@127.0.0.1:6390/0") == "redis://:***@127.0.0.1:6390/0"
    assert _without_password("redis://127.0.0.1:6390/0") == "redis://127.0.0.1:6390/0"


def test_the_predictor_worker_consumes_only_its_queue_one_task_at_a_time():
    from clockq.stack.roles import predictor_worker_argv

    argv = predictor_worker_argv(host="h")
    assert argv[argv.index("--queues") + 1] == "predictor"
    assert argv[argv.index("--concurrency") + 1] == "1" and argv[argv.index("--pool") + 1] == "solo"
    assert argv[argv.index("--hostname") + 1] == "predictor@h"


@pytest.mark.django_db
def test_make_run_starts_a_predictor_worker_beside_the_control_worker(tmp_path, settings, monkeypatch):
    """runstack's children, captured instead of started (REDIS_URL set: no embedded broker)."""
    from clockq.management.commands import runstack
    from tests.harness import free_port

    settings.VAR_DIR = tmp_path / "var"
    settings.PORT, settings.FLOWER_PORT = free_port(), free_port()
    settings.CLOCKQ_ADMIN_PASSWORD = "not-a-real-password-123"
    settings.CLOCKQ_EMBEDDED_BROKER = False  # REDIS_URL set: no embedded broker
    started = {}

    def run_forever(self):
        started.update({child.name: child.argv for child in self.children})
        return 0

    monkeypatch.setattr(runstack.Supervisor, "run_forever", run_forever)
    monkeypatch.setattr(runstack.Command, "_announce_ready", lambda *a, **k: None)
    with pytest.raises(SystemExit):
        runstack.Command().handle(demo=False, bind="127.0.0.1")
    assert {"web", "gpuworkers", "control", "predictor", "beat", "flower"} <= set(started)
    predictor = started["predictor"]
    assert predictor[predictor.index("--queues") + 1] == "predictor"
    control = started["control"]
    assert control[control.index("--queues") + 1] == "control"
    assert started["flower"][1:3] == ["-m", "clockq.flower"]  # Flower with failed logins locked out


@pytest.mark.parametrize("bind", ["127.0.0.1:8000", "0.0.0.0:80", "[::1]:8000", "", "host name", "a/b"])
def test_a_bind_address_with_a_port_or_junk_is_refused_before_anything_starts(bind):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="without a port"):
        call_command("runstack", "--bind", bind)


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::1", "2001:db8::1", "gpu-host.example"])
def test_addresses_and_host_names_are_accepted(bind):
    from clockq.management.commands.runstack import _is_address

    assert _is_address(bind)


@pytest.mark.parametrize(
    ("role", "children"),
    [
        ("gpu", {"gpuworkers"}),
        ("gpu,beat", {"gpuworkers", "beat"}),
        ("web,control,predictor", {"web", "control", "predictor"}),
        ("flower", {"flower"}),
    ],
)
def test_a_host_starts_only_its_roles_each_told_the_host_name(role, children, settings):
    from clockq.management.commands.runstack import Command
    from clockq.stack.preflight import parse_roles
    from tests.harness import free_port

    settings.PORT, settings.FLOWER_PORT = free_port(), free_port()
    settings.CLOCKQ_ADMIN_PASSWORD = "not-a-real-password-123"
    settings.CLOCKQ_EMBEDDED_BROKER = False
    started = Command()._children(parse_roles(role), "127.0.0.1")
    assert {child.name for child in started} == children  # no private broker: REDIS_URL is set
    assert all(child.env["CLOCKQ_HOST"] == settings.CLOCKQ_HOST for child in started)
