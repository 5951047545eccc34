"""Benchmark: jobs submitted per second through the API over real HTTP, with
an API token, single jobs and batches, against `GET /healthz` in the same run. Goal: at least
200 jobs/s single and 2,000 jobs/s in batches.

    .venv/bin/python bench/api_submit.py                  # SQLite, default rounds
    .venv/bin/python bench/api_submit.py --db both        # SQLite, then a throwaway PostgreSQL
    .venv/bin/python bench/api_submit.py --rounds 5 --clients 8 --json out.json

In a private clockq (bench/_harness.py: its own directory, SQLite file, var directory and
redis-server, so each submit really publishes its dispatch message), gunicorn as `make run`
starts it (2 workers x 4 threads), with HTTP basic auth on for the comparison. One user and a
knox token made in this process. Then, per round, `--clients` threads each on a kept-alive
connection:

1. GET /healthz, requests/s: the baseline (a database and a broker check; 503 here, as no GPU
   worker runs);
2. POST /api/jobs, one job per request, with the token: jobs/s;
3. POST /api/jobs with a list of `--batch` jobs, with the token: jobs/s;
4. POST /api/jobs, one job per request, with HTTP basic auth (a few only: each one hashes the
   password, PBKDF2): jobs/s.

Prints each one's median over the rounds and its ratio to the baseline. The quota is raised so
that it never refuses; the jobs stay queued (no GPU workers run).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import threading
import time
from pathlib import Path

import _harness as h
import requests
from _databases import postgres_cluster, run_per_database  # a throwaway cluster, as .ci/run makes one

USER, PASSWORD = "bench", "bench-password-not-secret"
JOB = {"name": "bench", "tier": "BK", "workload": "synthetic", "params": {"steps": 1}}


def make_user_and_token() -> str:
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken

    user = get_user_model().objects.create_user(USER, password=PASSWORD)
    _instance, token = AuthToken.objects.create(user=user)
    return token


def rate(clients: int, per_client: int, call, jobs_per_call: int = 1) -> float:
    """Jobs (or requests) per second: `clients` threads, each making `per_client` calls on its
    own kept-alive session. Every answer must be 2xx, but /healthz's 503: it answers that with no
    GPU worker alive, after the same checks."""
    errors: list[str] = []
    barrier = threading.Barrier(clients + 1)

    def worker() -> None:
        session = requests.Session()
        barrier.wait()
        for _ in range(per_client):
            response = call(session)
            if not response.ok and not (response.status_code == 503 and "/healthz" in response.url):
                errors.append(f"{response.status_code} {response.text[:200]}")
                return

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} calls failed, e.g. {errors[0]}")
    return clients * per_client * jobs_per_call / elapsed


def run(args) -> dict:
    with contextlib.ExitStack() as stack:
        settings = {
            "CLOCKQ_API_BASIC_AUTH": "true",
            "CLOCKQ_API_BASIC_AUTH_RATE": "100000/min",
            "CLOCKQ_QUOTA_ACTIVE_JOBS": "100000000",
            "CLOCKQ_API_MAX_BATCH": str(max(args.batch, 500)),
            "CLOCKQ_API_MAX_BODY_BYTES": str(8 * 2**20),
        }
        if args.db == "postgres":
            settings["DATABASE_URL"] = stack.enter_context(postgres_cluster())
        q = stack.enter_context(h.private_clockq("clockq-bench-api-", **settings))
        token = make_user_and_token()
        _service, url = h.start_gunicorn(q)
        token_h = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        one = json.dumps(JOB)
        batch = json.dumps([JOB] * args.batch)
        targets = {
            "GET /healthz (baseline, requests/s)": (lambda s: s.get(f"{url}/healthz", timeout=30), 1, args.n),
            "single POST, token (jobs/s)": (
                lambda s: s.post(f"{url}/api/jobs", data=one, headers=token_h, timeout=30),
                1,
                args.n,
            ),
            f"batches of {args.batch}, token (jobs/s)": (
                lambda s: s.post(f"{url}/api/jobs", data=batch, headers=token_h, timeout=120),
                args.batch,
                args.n_batches,
            ),
            "single POST, basic auth (jobs/s)": (
                lambda s: s.post(
                    f"{url}/api/jobs",
                    data=one,
                    headers={"Content-Type": "application/json"},
                    auth=(USER, PASSWORD),
                    timeout=60,
                ),
                1,
                args.n_basic,
            ),
        }
        for call, _jobs, _n in targets.values():  # warm up every worker and thread
            rate(args.clients, 1, call)
        figures: dict[str, list[float]] = {name: [] for name in targets}
        for _round in range(args.rounds):
            for name, (call, jobs, n) in targets.items():
                figures[name].append(rate(args.clients, n, call, jobs))
        from clockq.jobs.models import Job

        return {
            "database": args.db,
            "clients": args.clients,
            "rounds": args.rounds,
            "batch": args.batch,
            "jobs_in_db": Job.objects.count(),
            "median": {name: statistics.median(v) for name, v in figures.items()},
            "all": figures,
        }


def report(result: dict) -> None:
    base = next(iter(result["median"].values()))
    print(
        f"\nAPI submit on {result['database']}, gunicorn 2 workers x 4 threads, {result['clients']} clients, "
        f"median of {result['rounds']} rounds ({result['jobs_in_db']} jobs written in all)"
    )
    for name, value in result["median"].items():
        print(f"  {name:42s} {value:9.1f}   {value / base:6.3f} x healthz")
    single = result["median"]["single POST, token (jobs/s)"]
    batched = result["median"][f"batches of {result['batch']}, token (jobs/s)"]
    basic = result["median"]["single POST, basic auth (jobs/s)"]
    print(f"  goals: single >= 200 jobs/s: {'met' if single >= 200 else 'MISSED'} ({single:.0f});")
    print(f"         batches >= 2,000 jobs/s: {'met' if batched >= 2000 else 'MISSED'} ({batched:.0f});")
    print(f"  token vs basic auth, single: {single / basic:.1f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8, help="concurrent client threads")
    parser.add_argument("--n", type=int, default=50, help="requests per client per round (healthz, single)")
    parser.add_argument("--batch", type=int, default=100, help="jobs per batch")
    parser.add_argument("--n-batches", type=int, default=3, help="batches per client per round")
    parser.add_argument("--n-basic", type=int, default=2, help="basic-auth requests per client per round")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    argv = [f"--rounds={args.rounds}", f"--clients={args.clients}", f"--n={args.n}"]
    argv += [f"--batch={args.batch}", f"--n-batches={args.n_batches}", f"--n-basic={args.n_basic}"]
    run_per_database(args, __file__, argv, functools.partial(run, args), report, rule=80)


if __name__ == "__main__":
    main()
