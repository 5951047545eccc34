"""Three hosts, each a network namespace with its own address and hostname, sharing one
PostgreSQL, one Redis (reached over the veth pairs) and one checkpoint folder: the roles as a
cluster runs them (`manage.py runstack --role ...`).

- A host that would run alone by mistake refuses to start: a broker on its loopback while
  other hosts are live, a checkpoint folder without the web role's marker.
- Jobs spread over every host.
- Drain a host: its jobs move to the others and none fails; it takes no job until resumed.
- Kill a whole host (kill -9 of every process on it) that runs jobs and the leading beat: the
  other beat takes over, nothing is lost, nothing runs twice, and its jobs run again elsewhere
  within 30 s.

Skipped, saying why, where the machine cannot make namespaces (no root, no `ip`).
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
import redis

from clockq.bus.beat_lock import LOCK_KEY
from clockq.bus.heartbeat import KEY_PREFIX
from clockq.bus.redis_server import redis_server_argv
from tests.harness import ROOT, Service, free_port, wait_for
from tests.netns import Host, Lab, Postgres, namespaces_problem

pytestmark = [pytest.mark.slow, pytest.mark.integration]

STEPS = 240  # per job; 20 ms each
RESUME_WITHIN_S = 30


class Cluster:
    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.lab = Lab(3)
        self.shared = tmp_path / "shared-checkpoints"
        self.redis_password = secrets.token_urlsafe(16)
        self.redis_port = free_port()
        self.web_port = free_port()
        self.secret_key = secrets.token_urlsafe(40)
        self.admin_password = secrets.token_urlsafe(12)
        self.services: list[Service] = []
        self.token = ""

    def start(self) -> Cluster:
        self.lab.start()
        gateways = self.lab.gateways()
        self.pg = Postgres(gateways, self.tmp / "postgres.log").start()
        argv = redis_server_argv(
            self.redis_port, self.tmp, durable=False, password=self.redis_password, bind=" ".join(gateways)
        )
        self.services.append(Service("redis", argv, dict(os.environ), self.tmp, self.tmp / "redis.log").start())
        self.redis = redis.Redis.from_url(self._redis_url(gateways[0]))
        wait_for(self._redis_answers, 20, what="the shared Redis")
        return self

    def _redis_answers(self) -> bool:
        try:
            return bool(self.redis.ping())
        except redis.ConnectionError:
            return False

    def _redis_url(self, address: str) -> str:
        return f"redis://:{self.redis_password}@{address}:{self.redis_port}/0"

    def env(self, host: Host, **extra: str) -> dict[str, str]:
        """What a host's roles are given: the shared database, broker and folder, reached from it."""
        var = self.tmp / f"{host.name}-var"
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(var),
            "DATABASE_URL": self.pg.url(host.gateway),
            "REDIS_URL": self._redis_url(host.gateway),
            "CLOCKQ_CHECKPOINT_DIR": str(self.shared),
            "SECRET_KEY": self.secret_key,
            "CLOCKQ_ADMIN_PASSWORD": self.admin_password,
            "CLOCKQ_VAR_DIR": str(var),
            "CLOCKQ_BIND": host.address,
            "ALLOWED_HOSTS": host.address,
            "PORT": str(self.web_port),
            "CLOCKQ_COMMAND_SANDBOX": "none",
            # Short leases, so that the test is quick: a dead host's jobs are taken back after 4 s
            # of silence, by a reaper that runs every 2 s; a dead beat's lock lasts 4 s.
            "CLOCKQ_LEASE_S": "4",
            "CLOCKQ_REAP_EVERY_S": "2",
            "CLOCKQ_RECONCILE_EVERY_S": "3",
            "CLOCKQ_BEAT_LOCK_S": "4",
            "CLOCKQ_CHECKPOINT_EVERY_S": "0.5",
            "CLOCKQ_PREFETCH_EVERY_S": "0",
            **extra,
        }

    def run_role(self, host: Host, role: str, gpus: int = 0, **extra: str) -> Service:
        env = self.env(host, CLOCKQ_GPUS=f"sim:{max(gpus, 1)}", **extra)
        argv = self.lab.argv_on(host, [sys.executable, "manage.py", "runstack", "--role", role])
        service = Service(f"{role} on {host.name}", argv, env, ROOT, self.tmp / f"{host.name}.log").start()
        self.services.append(service)
        return service

    def refused(self, host: Host, role: str, **extra: str) -> str:
        """Start `role` on `host`, expecting a refusal: its output."""
        argv = self.lab.argv_on(host, [sys.executable, "manage.py", "runstack", "--role", role])
        done = subprocess.run(argv, cwd=ROOT, env=self.env(host, **extra), capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, done.stdout
        return done.stderr

    def api(self, method: str, path: str, body: object = None) -> dict | list:
        web = self.lab.hosts[0].address
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://{web}:{self.web_port}{path}", data, method=method)
        request.add_header("Authorization", f"Token {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=20) as response:
            return json.loads(response.read())

    def wait_healthy(self) -> None:
        web = f"http://{self.lab.hosts[0].address}:{self.web_port}/healthz"

        def healthy() -> bool:
            for service in self.services:
                service.check_alive()
            try:
                with urllib.request.urlopen(web, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(healthy, 240, interval=0.5, what="the web role to answer /healthz 200")
        self.token = subprocess.run(
            [sys.executable, "manage.py", "createtoken", "admin"],
            cwd=ROOT,
            env=self.env(self.lab.hosts[0]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def sql(self, query: str, *params) -> list[tuple]:
        with psycopg.connect(self.pg.url(self.lab.hosts[0].gateway)) as db:
            return db.execute(query, params).fetchall()

    def running_on(self) -> dict[int, str]:
        """Running job -> the host it runs on."""
        return {job: worker.split("@")[1] for job, worker in self.sql(_RUNNING)}

    def consuming(self, name: str) -> bool | None:
        raw = self.redis.get(KEY_PREFIX + name)
        return None if raw is None else json.loads(raw).get("consuming")

    def submit(self, count: int, name: str, steps: int = STEPS) -> list[int]:
        jobs = [
            {"name": f"{name}-{i}", "tier": "SP", "workload": "synthetic", "params": {"steps": steps, "step_ms": 20}}
            for i in range(count)
        ]
        return [job["id"] for job in self.api("POST", "/api/jobs", jobs)]

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop(grace_s=20)
        self.lab.stop()
        if hasattr(self, "pg"):
            self.pg.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}" for p in self.tmp.glob("*.log"))


_RUNNING = "SELECT id, worker FROM jobs_job WHERE state = 'running'"
_CLAIMS_SINCE = (
    "SELECT count(*) FROM jobs_jobevent WHERE from_state = 'queued' AND to_state = 'running' "
    "AND actor LIKE %s AND at > %s"
)
_SLICES_SINCE = "SELECT count(*) FROM jobs_slice WHERE worker LIKE %s AND started_at > %s"


@pytest.fixture
def cluster(tmp_path):
    if problem := namespaces_problem():
        pytest.skip(f"the multi-host test needs network namespaces: {problem}")
    made = Cluster(tmp_path)
    try:
        yield made.start()
    finally:
        made.stop()
        print(made.logs())  # shown only when the test fails


def test_jobs_spread_over_hosts_move_off_a_drained_host_and_survive_a_dead_one(cluster):
    web_host, *gpu_hosts = cluster.lab.hosts
    start_the_hosts(cluster, web_host, gpu_hosts)
    leader = _leading_beat(cluster)
    other = next(h for h in gpu_hosts if h.name != leader.name)

    first_wave = cluster.submit(8, "wave1")
    jobs_spread_over_every_host(cluster, {h.name for h in cluster.lab.hosts})
    a_drained_host_hands_its_jobs_on(cluster, other, first_wave)

    second_wave = jobs_on_one_host(cluster, leader, [web_host, other])
    a_dead_host_loses_nothing_and_a_second_beat_takes_over(cluster, leader, other, second_wave)

    every_job_ran_once(cluster, first_wave + second_wave)


def start_the_hosts(cluster: Cluster, web_host: Host, gpu_hosts: list[Host]) -> None:
    cluster.run_role(web_host, "web,control,gpu", gpus=1)
    cluster.wait_healthy()
    # A host that would run alone by mistake refuses to start, saying why
    loopback = cluster.refused(gpu_hosts[1], "gpu", REDIS_URL=f"redis://127.0.0.1:{cluster.redis_port}/0")
    assert "host(s) host0 are live on this database" in loopback and "loopback" in loopback
    elsewhere = cluster.refused(gpu_hosts[1], "gpu", CLOCKQ_CHECKPOINT_DIR=str(cluster.tmp / "not-shared"))
    assert "holds no .clockq-shared-folder" in elsewhere
    for host in gpu_hosts:
        cluster.run_role(host, "gpu,beat", gpus=2)
    names = ["gpu0@host0", "gpu0@host1", "gpu1@host1", "gpu0@host2", "gpu1@host2"]

    def all_live() -> bool:
        for service in cluster.services:
            service.check_alive()
        return cluster.redis.exists(*(KEY_PREFIX + n for n in names)) == len(names)

    wait_for(all_live, 240, interval=0.5, what="every GPU worker of the three hosts")


def _leading_beat(cluster: Cluster) -> Host:
    token = wait_for(lambda: cluster.redis.get(LOCK_KEY), 60, what="a beat to lead").decode()
    return next(h for h in cluster.lab.hosts if token.startswith(f"{h.name}:"))


def jobs_spread_over_every_host(cluster: Cluster, hosts: set[str]) -> None:
    wait_for(lambda: set(cluster.running_on().values()) == hosts, 60, what=f"jobs running on each of {hosts}")


def a_drained_host_hands_its_jobs_on(cluster: Cluster, host: Host, wave: list[int]) -> None:
    moved = [job for job, on in cluster.running_on().items() if on == host.name]
    assert moved
    answer = cluster.api("POST", f"/api/hosts/{host.name}/drain", {"reason": "kernel upgrade"})
    assert answer["drained"] and answer["drained_by"] == "admin"
    wait_for(lambda: not cluster.api("GET", f"/api/hosts/{host.name}")["running_jobs"], 60, what="the drain")
    (emptied_at,) = cluster.sql("SELECT now()")[0]
    for gpu in (0, 1):
        wait_for(lambda g=gpu: cluster.consuming(f"gpu{g}@{host.name}") is False, 30, what="its GPUs to stop")
    (drained_at,) = cluster.sql("SELECT drained_at FROM fleet_host WHERE name = %s", host.name)[0]

    # Its jobs go on elsewhere, and the first wave finishes without it: it claims no job after
    # its drain, and runs nothing once its jobs have left.
    wait_for(lambda: _all_succeeded(cluster, wave), 180, interval=0.5, what="the first wave to finish")
    claims = cluster.sql(_CLAIMS_SINCE, f"%@{host.name}", drained_at)[0][0]
    assert claims == 0, f"{host.name} claimed {claims} job(s) after its drain"
    late = cluster.sql(_SLICES_SINCE, f"%@{host.name}", emptied_at)[0][0]
    assert late == 0, f"{host.name} ran {late} slice(s) once its jobs had left"
    elsewhere = cluster.sql(
        "SELECT DISTINCT job_id FROM jobs_slice WHERE job_id = ANY(%s) AND worker NOT LIKE %s",
        moved,
        f"%@{host.name}",
    )
    assert {job for (job,) in elsewhere} == set(moved)
    workers = {w["hostname"]: w for w in cluster.api("GET", "/api/queues")["workers"]}
    drained = {name for name, w in workers.items() if w.get("drained")}
    # Each GPU's RT lane (on by default) is drained with it
    assert drained == {f"{w}{gpu}@{host.name}" for w in ("gpu", "rt") for gpu in (0, 1)}, workers


def jobs_on_one_host(cluster: Cluster, host: Host, others: list[Host]) -> list[int]:
    """Drain every other host, give `host` two jobs, then resume the others: so the jobs run on
    `host` while the others have GPUs free to take them over."""
    for other in others:
        cluster.api("POST", f"/api/hosts/{other.name}/drain")
    wave = cluster.submit(2, "wave2", steps=2 * STEPS)
    wait_for(lambda: [cluster.running_on().get(j) for j in wave] == [host.name] * 2, 60, what=f"both on {host.name}")
    for other in others:
        assert not cluster.api("POST", f"/api/hosts/{other.name}/resume")["drained"]
    for name in ("gpu0@host0", *(f"gpu{g}@{h.name}" for h in others if h.name != "host0" for g in (0, 1))):
        wait_for(lambda n=name: cluster.consuming(n) is True, 30, what=f"{name} to take jobs again")
    return wave


def a_dead_host_loses_nothing_and_a_second_beat_takes_over(
    cluster: Cluster, dead: Host, survivor: Host, wave: list[int]
) -> None:
    cluster.lab.kill(dead)
    killed_at = time.monotonic()

    # The other beat takes the lock once the dead one's lease ran out (4 s), and the reaper it
    # drives takes the dead host's jobs back; they run again on the other hosts within 30 s.
    wait_for(lambda: (cluster.redis.get(LOCK_KEY) or b"").startswith(f"{survivor.name}:".encode()), 15, what="takeover")

    def resumed_elsewhere() -> bool:
        running = cluster.running_on()
        done = {job for (job,) in cluster.sql("SELECT id FROM jobs_job WHERE state = 'succeeded'")}
        return all(job in done or running.get(job) not in (None, dead.name) for job in wave)

    wait_for(resumed_elsewhere, RESUME_WITHIN_S - (time.monotonic() - killed_at), interval=0.2, what="the resume")
    wait_for(lambda: _all_succeeded(cluster, wave), 180, interval=0.5, what="the second wave to finish")
    lost = cluster.sql("SELECT job_id, worker FROM jobs_slice WHERE outcome = 'lost' AND job_id = ANY(%s)", wave)
    assert {job for job, _ in lost} == set(wave) and all(w.endswith(f"@{dead.name}") for _, w in lost)


def every_job_ran_once(cluster: Cluster, jobs: list[int]) -> None:
    """Nothing lost, nothing failed, nothing run twice: each job succeeded, its slices never
    overlap (it never ran on two GPUs at once), and the steps of the slices not rolled back add
    up to its steps exactly."""
    rows = cluster.sql("SELECT id, state, failures, params FROM jobs_job WHERE id = ANY(%s) ORDER BY id", jobs)
    assert [(job, state, failures) for job, state, failures, _ in rows] == [(j, "succeeded", 0) for j in sorted(jobs)]
    for job, _state, _failures, params in rows:
        slices = cluster.sql(
            "SELECT started_at, ended_at, steps, rolled_back FROM jobs_slice WHERE job_id = %s ORDER BY started_at", job
        )
        for (_, ended, _, _), (started, _, _, _) in itertools.pairwise(slices):
            assert ended <= started, f"job {job} ran on two GPUs at once"
        assert sum(steps for _, _, steps, rolled_back in slices if not rolled_back) == params["steps"], job


def _all_succeeded(cluster: Cluster, jobs: list[int]) -> bool:
    states = cluster.sql("SELECT state FROM jobs_job WHERE id = ANY(%s)", jobs)
    assert not {s for (s,) in states} & {"failed", "cancelled", "timed_out"}, states
    return len(states) == len(jobs) and all(s == "succeeded" for (s,) in states)
