"""The whole `manage.py runstack` (what `make run` starts) as a test's real process: on free
ports, with its own SQLite and embedded broker in a temporary folder, two simulated GPUs, and a
short reconcile period."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from clockq.supervision import procs
from tests.harness import ROOT, Service, free_port, wait_for

ADMIN_PASSWORD = "stack-admin-pass-123"


class Stack:
    """One start of the stack; `start` again on the same ports and folder is a restart."""

    def __init__(self, tmp_path):
        self.web, self.flower, self.broker = free_port(), free_port(), free_port()
        self.log_path = tmp_path / "runstack.log"
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
        self.env = {
            **env,
            "CLOCKQ_VAR_DIR": str(tmp_path / "var"),
            "PORT": str(self.web),
            "FLOWER_PORT": str(self.flower),
            "CLOCKQ_EMBEDDED_REDIS_PORT": str(self.broker),
            "CLOCKQ_GPUS": "sim:2",
            "CLOCKQ_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "CLOCKQ_RECONCILE_EVERY_S": "2",
            "CLOCKQ_REDISPATCH_GRACE_S": "2",
        }
        self.token = ""

    def start(self) -> Stack:
        self.service = Service("runstack", [sys.executable, "manage.py", "runstack"], self.env, ROOT, self.log_path)
        self.service.start()
        wait_for(lambda: self.alive() and self.healthy(), 120, interval=0.5, what="the stack to answer /healthz 200")
        made = subprocess.run(
            [sys.executable, "manage.py", "createtoken", "admin"], cwd=ROOT, env=self.env, capture_output=True
        )
        self.token = made.stdout.decode().strip()
        return self

    def alive(self) -> bool:
        self.service.check_alive()
        return True

    def output(self) -> str:
        return self.service.log_text()

    def request(self, path: str, body: dict | None = None, port: int | None = None, headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{port or self.web}{path}",
            data=data,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                raw = response.read()
                is_json = response.headers.get_content_type() == "application/json"
                return response.status, json.loads(raw) if is_json else raw.decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, None

    def healthy(self) -> bool:
        try:
            return self.request("/healthz")[0] == 200
        except OSError:
            return False

    def broker_pid(self) -> int | None:
        found = subprocess.run(["pgrep", "-f", f"redis-server 127.0.0.1:{self.broker}"], capture_output=True, text=True)
        pids = found.stdout.split()
        return int(pids[0]) if pids else None

    def stop(self) -> None:
        self.service.stop(grace_s=90)

    def processes(self) -> dict[procs.Identity, str]:
        """Every process the supervisor started, children and theirs, with its command line."""
        everyone = procs.all_seen()
        found: dict[procs.Identity, str] = {}
        parents = {self.service.proc.pid}
        while True:
            new = {p for p in everyone if p.ppid in parents and procs.Identity(p.pid, p.start) not in found}
            if not new:
                return found
            for p in new:
                found[procs.Identity(p.pid, p.start)] = procs.command_line(p.pid)
            parents |= {p.pid for p in new}
