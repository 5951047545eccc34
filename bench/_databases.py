"""The databases a benchmark measures: a throwaway PostgreSQL cluster beside the private
clockq's SQLite file, and a main() for benches that run on 'sqlite', 'postgres' or 'both'."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import _harness as h

DATABASES = ("sqlite", "postgres")


@contextlib.contextmanager
def postgres_cluster(extra_options: str = "") -> Iterator[str]:
    """A throwaway PostgreSQL cluster, made and started as .ci/run does; its database URL.
    `extra_options` go on the server's command line after the usual ones (`-c name=value ...`),
    so they may override them."""
    as_pg: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        user = "postgres" if shutil.which("runuser") and _user_exists("postgres") else "nobody"
        as_pg = ["runuser", "-u", user, "--"]
    pgdir = Path(tempfile.mkdtemp(prefix="clockq-bench-pg."))
    pgdir.chmod(0o755)
    if as_pg:
        shutil.chown(pgdir, as_pg[2])
    port = h.free_port()
    data = pgdir / "data"
    try:
        subprocess.run(
            [*as_pg, "initdb", "-D", str(data), "-A", "trust", "-U", "clockq"], check=True, capture_output=True
        )
        options = f"-p {port} -k {pgdir} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=512MB"
        options += f" {extra_options}" if extra_options else ""
        subprocess.run(
            [*as_pg, "pg_ctl", "-D", str(data), "-l", str(pgdir / "log"), "-w", "start", "-o", options],
            check=True,
            capture_output=True,
        )
        subprocess.run([*as_pg, "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "clockq", "clockq"], check=True)
        yield f"postgres://clockq@127.0.0.1:{port}/clockq"
    finally:
        subprocess.run([*as_pg, "pg_ctl", "-D", str(data), "-m", "fast", "stop"], capture_output=True, check=False)
        shutil.rmtree(pgdir, ignore_errors=True)


def _user_exists(name: str) -> bool:
    return subprocess.run(["id", name], capture_output=True, check=False).returncode == 0


def database_name(connection) -> str:
    if connection.vendor == "sqlite":
        return f"SQLite {connection.Database.sqlite_version}"
    major, minor = divmod(connection.pg_version, 10_000)
    return f"PostgreSQL {major}.{minor}"


def run_per_database(
    args: argparse.Namespace,
    script: str,
    argv: Sequence[str],
    run: Callable[[], dict],
    report: Callable[[dict], None],
    rule: int,
) -> None:
    """The main() of a bench with --db sqlite|postgres|both and --json: `run()` on one database,
    or, for both, `script` with `argv` once per database, each in a process of its own (Django
    is set up once per process), reported together under a rule `rule` wide. The results go to
    args.json too, if given."""
    if args.db == "both":
        results = []
        for db in DATABASES:
            with tempfile.NamedTemporaryFile(suffix=".json") as out:
                subprocess.run([sys.executable, script, *argv, "--db", db, "--json", out.name], check=True)
                results.append(json.loads(Path(out.name).read_text()))
        print("\n" + "=" * rule)
        for result in results:
            report(result)
        written: dict | list = results
    else:
        written = run()
        report(written)
    if args.json:
        args.json.write_text(json.dumps(written, indent=2))
