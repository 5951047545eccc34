"""A command program has a network of its own: it cannot reach the host's loopback services nor
see their ports, while the operator may still give it the host's network or none. Each test runs
a real program in a real sandbox against a real server the test listens with."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from clockq.jobs import workloads
from clockq.jobs.checkpoints import CheckpointStore
from tests.harness import needs_private_network, needs_sandbox, processes_of, program_python
from workers import program_network, sandbox
from workers.program_network import NetworkMode
from workers.workloads import command
from workers.workloads.base import JobRefused, RunContext
from workers.workloads.command import CommandWorkload

pytestmark = needs_sandbox()

PY = program_python()
# Tries each "host:port" of argv[1:], and reads what the program's /proc/net/tcp lists.
PROBE = r"""
import json, socket, sys
report = {"reached": {}, "listening": [], "interfaces": []}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        report["reached"][target] = "yes"
    except OSError as exc:
        report["reached"][target] = exc.strerror or type(exc).__name__
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    if state == "0A":  # LISTEN
        report["listening"].append(int(local.split(":")[1], 16))
report["interfaces"] = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])
open("report.json", "w").write(json.dumps(report))
"""


@pytest.fixture
def listener():
    """A server listening on the host's loopback, as the web server, Flower, Redis and
    PostgreSQL do under `make run`."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def outside_address() -> str | None:
    """An address of this host other than loopback (a program's network reaches it as it would
    any outside one), or None."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout
    return next((line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3), None)


def probe(*targets: str) -> tuple[CommandWorkload, dict]:
    params = workloads.validate("command", {"argv": [PY, "-c", PROBE, *targets], "step_ms": 5.0}, may_run_commands=True)
    workload = CommandWorkload(params)
    workload.setup(RunContext(7, 0, CheckpointStore(settings.CLOCKQ_CHECKPOINT_DIR).work_dir(7)))
    try:
        while workload.step() < 1.0:
            pass
    finally:
        workload.close()
    return workload, json.loads((workload.work_dir / "report.json").read_text())


@pytest.fixture(autouse=True)
def _no_handler_wait(monkeypatch):
    monkeypatch.setattr(command, "HANDLER_WAIT_S", 0.05)  # the probe installs no SIGUSR1 handler


@needs_private_network()
def test_by_default_a_program_cannot_reach_the_hosts_loopback_services_nor_see_their_ports(listener):
    assert settings.CLOCKQ_COMMAND_NETWORK == "private"  # the default
    assert listener in host_listening_ports()

    # 10.0.2.2 is slirp4netns's way to the host's loopback, which --disable-host-loopback closes.
    _, report = probe(f"127.0.0.1:{listener}", f"10.0.2.2:{listener}")

    assert report["reached"] == {
        f"127.0.0.1:{listener}": "Connection refused",  # its own loopback, where nothing listens
        f"10.0.2.2:{listener}": "Network is unreachable",
    }
    assert listener not in report["listening"]
    assert report["interfaces"] == ["lo", "tap0"]


@needs_private_network()
def test_a_program_on_its_own_network_reaches_the_hosts_other_addresses_as_outside_ones():
    address = outside_address()
    if address is None:
        pytest.skip("this host has no address but loopback")
    with socket.create_server((address, 0)) as server:  # reached through slirp4netns, never off the machine
        target = f"{address}:{server.getsockname()[1]}"
        _, report = probe(target)
    assert report["reached"] == {target: "yes"}


@pytest.mark.parametrize(
    ("network", "reached", "interfaces"),
    [
        ("host", "yes", None),
        ("none", "Connection refused", ["lo"]),
        pytest.param("private", "Connection refused", ["lo", "tap0"], marks=needs_private_network()),
    ],
)
def test_the_operator_may_give_programs_the_hosts_network_or_loopback_only(
    settings, listener, network, reached, interfaces
):
    settings.CLOCKQ_COMMAND_NETWORK = network
    _, report = probe(f"127.0.0.1:{listener}")
    assert report["reached"] == {f"127.0.0.1:{listener}": reached}
    if interfaces is not None:  # the host's own, whatever they are
        assert report["interfaces"] == interfaces
    assert (listener in report["listening"]) is (network == "host")


@needs_private_network()
def test_slirp4netns_runs_as_the_jobs_uid_while_the_program_runs_and_is_gone_when_it_ends(listener):
    workload, report = probe()
    assert "tap0" in report["interfaces"]  # slirp4netns had configured it before the program ran
    assert processes_of(workload.folder.owner) == []  # slirp4netns went with it, reaped


def test_without_slirp4netns_commands_are_refused_unless_the_operator_picks_another_network(settings, monkeypatch):
    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "slirp4netns" else real_which(name))
    settings.CLOCKQ_COMMAND_NETWORK = "private"  # the default (the suite's may be none: tests/conftest.py)
    with pytest.raises(JobRefused, match=r"apt-get install slirp4netns\), or set CLOCKQ_COMMAND_NETWORK=none"):
        sandbox.sandbox_for_commands()
    settings.CLOCKQ_COMMAND_NETWORK = "none"
    assert sandbox.sandbox_for_commands().network is NetworkMode.NONE


@pytest.mark.skipif(os.geteuid() != 0, reason="programs run as uids of their own only under a root worker")
def test_where_the_jobs_uids_cannot_open_the_tun_device_commands_are_refused_saying_how_to_fix_it(
    settings, monkeypatch, tmp_path
):
    # Given a tun device that only root may open (a host that made /dev/net/tun 0600)
    device = tmp_path / "tun"
    device.touch(mode=0o600)
    monkeypatch.setattr(program_network, "TUN_DEVICE", str(device))
    settings.CLOCKQ_COMMAND_NETWORK = "private"  # the default (the suite's may be none: tests/conftest.py)

    # Then a command is refused before it starts, saying why and what to do, not failed at its start
    with pytest.raises(JobRefused, match=r"is mode 0600, owned by uid 0: uid \d+ cannot open it.*chmod 0666"):
        sandbox.sandbox_for_commands()
    # And the operator's other choices still run
    settings.CLOCKQ_COMMAND_NETWORK = "none"
    assert sandbox.sandbox_for_commands().network is NetworkMode.NONE
    device.chmod(0o666)
    settings.CLOCKQ_COMMAND_NETWORK = "private"
    assert sandbox.sandbox_for_commands().network is NetworkMode.PRIVATE


def host_listening_ports() -> set[int]:
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return {int(line.split()[1].split(":")[1], 16) for line in lines if line.split()[3] == "0A"}
