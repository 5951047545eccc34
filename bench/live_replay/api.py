"""clockq's JSON API as the live replay uses it: a token from the environment, a client that
turns every failure into a LiveError saying what and where, and the check that the cluster
matches the simulated one."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import requests

from clockq.policy import ordering
from clockq.replay.config import ladder_text

TOKEN_ENV = "CLOCKQ_API_TOKEN"


class LiveError(RuntimeError):
    """The live run could not be done or read back; the message says what and which jobs."""


def token_from_env(environ: Mapping[str, str] = os.environ) -> str:
    token = environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise LiveError(
            f"live mode needs an API token in the environment variable {TOKEN_ENV} "
            "(make one with `python manage.py createtoken USER`, or on the API tokens page)"
        )
    return token


class Client:
    """clockq's JSON API with a knox token. (Not basic auth: it hashes a password per request.)"""

    def __init__(self, url: str, token: str, *, timeout_s: float = 15.0, session: requests.Session | None = None):
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise LiveError(f"the live URL must start with http:// or https://, not {url[:60]!r}")
        if not token:
            raise LiveError("no API token")
        self.url = url
        self.timeout_s = timeout_s
        self.session = session or requests.Session()
        self.session.headers.update({"Authorization": f"Token {token}", "Accept": "application/json"})

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = self.session.request(method, self.url + path, timeout=self.timeout_s, **kwargs)
        except requests.ConnectionError as exc:
            raise LiveError(f"{method} {self.url}{path}: cannot connect (is clockq running there?)") from exc
        except requests.RequestException as exc:
            raise LiveError(f"{method} {self.url}{path}: {type(exc).__name__}: {str(exc)[:200]}") from exc
        if r.status_code == 401:
            raise LiveError(f"{method} {self.url}{path}: 401, the token was refused (wrong or expired?)")
        if not 200 <= r.status_code < 300:
            raise LiveError(f"{method} {self.url}{path}: {r.status_code} {r.text[:300]}")
        try:
            return r.json()
        except ValueError as exc:
            raise LiveError(f"{method} {self.url}{path}: the answer is not JSON: {r.text[:200]!r}") from exc

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/jobs", json=body)

    def job(self, job_id: int, *, history: bool = False) -> dict[str, Any]:
        return self.request("GET", f"/api/jobs/{job_id}" + ("?history=1" if history else ""))

    def cancel(self, job_id: int) -> None:
        self.request("POST", f"/api/jobs/{job_id}/cancel")

    def queues(self) -> dict[str, Any]:
        return self.request("GET", "/api/queues")

    def kpis(self, since: datetime, until: datetime) -> dict[str, Any]:
        return self.request("GET", "/api/kpis", params={"since": since.isoformat(), "until": until.isoformat()})


def check_cluster(client: Client, gpus: int, ladder: ordering.Ladder = ordering.DEFAULT_LADDER) -> list[str]:
    """Refuse a cluster with another number of live GPU workers than the simulator's, or whose
    GPU workers order jobs on another service ladder than the simulator's `ladder` (each worker
    announces its CLOCKQ_SERVICE_LADDER_S); warn when jobs already wait or run there (they take
    GPUs the simulator does not know of)."""
    answer = client.queues()
    workers = answer.get("workers")
    if workers is None:
        raise LiveError(f"{client.url}/api/queues cannot list the workers (is its broker down?)")
    gpu_workers = [w for w in workers if w.get("gpu") is not None]
    if len(gpu_workers) != gpus:
        raise LiveError(
            f"the live cluster has {len(gpu_workers)} GPU worker(s) and the simulator {gpus}: "
            f"run with --gpus {len(gpu_workers)}, or start the cluster with {gpus} (CLOCKQ_GPUS=sim:{gpus})"
        )
    _check_ladders(gpu_workers, ladder)
    busy = {t["tier"]: t["waiting"] + t["running"] + t["held"] for t in answer.get("tiers", [])}
    busy = {tier: n for tier, n in busy.items() if n}
    if busy:
        return [f"the cluster was not idle at the start (waiting, running or held: {busy}): other work shares the GPUs"]
    return []


def _check_ladders(gpu_workers: list[dict[str, Any]], ladder: ordering.Ladder) -> None:
    """Every GPU worker must order by the simulator's ladder: a compressed replay on the default
    ladder compares two different orders (no live job would reach a rung)."""
    wanted = ladder.base_gpu_s
    off = {}
    for w in gpu_workers:
        theirs = w.get("service_ladder_s")
        if not _same_rungs(theirs, wanted):
            off[w.get("hostname", "?")] = "not announced (an older clockq?)" if theirs is None else theirs
    if off:
        raise LiveError(
            f"the live GPU workers do not order jobs on the simulator's service ladder ({ladder_text(ladder)} "
            f"GPU-seconds, the trace's divided by --compress); theirs: {off}. Restart the cluster with "
            f"CLOCKQ_SERVICE_LADDER_S={ladder_text(ladder)}"
        )


def _same_rungs(theirs: Any, wanted: tuple[float, ...]) -> bool:
    if not (isinstance(theirs, list) and len(theirs) == len(wanted)):
        return False
    pairs = zip(theirs, wanted, strict=True)
    return all(isinstance(a, int | float) and math.isclose(a, b, rel_tol=1e-9) for a, b in pairs)


def parse_time(raw: str | None) -> Any:
    """An API timestamp (ISO 8601) as an aware datetime; None stays None."""
    if raw is None or raw == "":
        return None
    when = datetime.fromisoformat(raw)
    return when if when.tzinfo else when.replace(tzinfo=UTC)
