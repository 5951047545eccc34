"""Hosts for a multi-host test on one machine: network namespaces that the test makes itself,
each with its own address and hostname, and a PostgreSQL cluster of the test's own.

Each host is a network namespace joined to the test's own namespace by a veth pair, a /30 of
198.18.0.0/15 (the benchmarking range, never routed): the test's side holds .1, the host's .2.
The test's namespace runs the shared PostgreSQL and Redis, listening only on its side of those
pairs, so traffic goes only between the namespaces made here. A process runs "on" a host through
`ip netns exec`, with a UTS namespace of its own whose hostname is the host's name. Killing a
host is SIGKILL to every process in its namespace (`ip netns pids`), all started here.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.harness import Service, free_port, wait_for


def namespaces_problem() -> str:
    """Why this machine cannot make the test's hosts; '' when it can."""
    if os.geteuid() != 0:
        return "making network namespaces and veth pairs needs root"
    for tool in ("ip", "unshare", "initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    name = f"cqprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Host:
    name: str  # its hostname, and so its CLOCKQ_HOST
    netns: str
    address: str  # its side of the veth pair
    gateway: str  # the test's side: where it reaches PostgreSQL and Redis


class Lab:
    """`count` hosts named host0.., made on start(), removed with every process in them on stop()."""

    def __init__(self, count: int):
        tag = f"{os.getpid() % 10000}{random.randrange(100, 1000)}"
        self.tag = tag
        self.octet = self._free_octet()
        self.hosts = [
            Host(f"host{i}", f"cq{tag}h{i}", f"198.18.{self.octet}.{4 * i + 2}", f"198.18.{self.octet}.{4 * i + 1}")
            for i in range(count)
        ]

    @staticmethod
    def _free_octet() -> int:
        """A /24 of 198.18.0.0/16 that no interface of this machine uses."""
        used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
        for octet in random.sample(range(1, 255), 254):
            if f" 198.18.{octet}." not in used:
                return octet
        raise RuntimeError("every 198.18.x.0/24 is in use")

    def _veth(self, i: int) -> tuple[str, str]:
        return f"cq{self.tag}v{i}a", f"cq{self.tag}v{i}b"  # at most 15 characters

    def start(self) -> Lab:
        for i, host in enumerate(self.hosts):
            outside, inside = self._veth(i)
            _ip("netns", "add", host.netns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", host.netns)
            _ip("addr", "add", f"{host.gateway}/30", "dev", outside)
            _ip("link", "set", outside, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/30", "dev", inside)
            _ip("-n", host.netns, "link", "set", inside, "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        return self

    def gateways(self) -> list[str]:
        return [h.gateway for h in self.hosts]

    def argv_on(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` run on `host`: in its network namespace, under its own hostname."""
        return [
            *("ip", "netns", "exec", host.netns, "unshare", "--uts", "--"),
            *("sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv),
        ]

    def pids(self, host: Host) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill(self, host: Host) -> list[int]:
        """kill -9 every process on `host`, as if it lost power. Returns their pids."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not self.pids(host), 30, what=f"every process on {host.name} to die")
        return pids

    def stop(self) -> None:
        for i, host in enumerate(self.hosts):
            with contextlib.suppress(Exception):
                self.kill(host)
            subprocess.run(["ip", "link", "del", self._veth(i)[0]], capture_output=True)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)


class Postgres:
    """A throwaway PostgreSQL cluster owned by an unprivileged user (initdb refuses root), as
    .ci/run makes one, listening on `addresses` and a free port, trusting only those."""

    def __init__(self, addresses: list[str], log_path: Path):
        self.addresses = addresses
        self.port = free_port()
        self.log_path = log_path
        self.user = "postgres" if _user_exists("postgres") else "nobody"
        self.dir = Path(tempfile.mkdtemp(prefix="clockq-netns-pg-"))
        self.dir.chmod(0o755)
        shutil.chown(self.dir, self.user)

    def _as_owner(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", self.user, "--", *argv], capture_output=True, text=True, check=True)

    def url(self, address: str) -> str:
        return f"postgres://clockq@{address}:{self.port}/clockq"

    def start(self) -> Postgres:
        data = self.dir / "data"
        self._as_owner("initdb", "-D", str(data), "-A", "trust", "-U", "clockq")
        with open(data / "pg_hba.conf", "a") as hba:  # as its owner wrote it: append only
            for network in sorted({address.rsplit(".", 1)[0] for address in self.addresses}):
                hba.write(f"host all all {network}.0/24 trust\n")
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses={','.join(self.addresses)} "
            "-c fsync=off -c max_connections=300"
        )
        self._as_owner("pg_ctl", "-D", str(data), "-l", str(self.dir / "log"), "-w", "-o", options, "start")
        self._as_owner("createdb", "-h", self.addresses[0], "-p", str(self.port), "-U", "clockq", "clockq")
        return self

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._as_owner("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "stop")
        with contextlib.suppress(OSError):
            shutil.copyfile(self.dir / "log", self.log_path)
        shutil.rmtree(self.dir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def service_on(lab: Lab, host: Host, name: str, argv: list[str], env: dict[str, str], cwd: Path, log: Path):
    return Service(f"{name} on {host.name}", lab.argv_on(host, argv), env, cwd, log)
