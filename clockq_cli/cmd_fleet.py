"""`clockq hosts`, `clockq drain` and `clockq resume`: maintenance of GPU hosts and workers
(like `scontrol update nodename=... state=drain`). A name with `@` is a GPU worker (`gpu0@host`),
any other a host (docs/api.md, "Hosts and workers")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import click

from clockq_cli import answers, render
from clockq_cli.client import Api
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.output import connect, console, emit_json, json_option, note

FIRST_POLL_S = 0.2
MAX_POLL_S = 2.0


def _path(name: str, *rest: str) -> tuple[str, str]:
    """The API path for a host or worker name, and what it is called in messages."""
    kind = "workers" if "@" in name else "hosts"
    what = f"{'GPU worker' if kind == 'workers' else 'host'} {name}"
    return "/".join([f"/api/{kind}", quote(name, safe=""), *rest]), what


@click.command()
@json_option
def hosts(as_json: bool) -> None:
    """The GPU hosts, their workers, and which are drained."""
    answer = connect(exact=as_json).get("/api/hosts", shape=answers.HOSTS)
    if as_json:
        emit_json(answer)
    else:
        console().print(render.hosts_table(answer.get("hosts") or []))


@click.command(short_help="Drain a GPU host or worker for maintenance (like scontrol drain).")
@click.argument("name")
@click.option("--reason", default=None, help="Why, for the record (at most 300 characters).")
@click.option("--wait", is_flag=True, help="Wait until no job runs there any more.")
@json_option
def drain(name: str, reason: str | None, wait: bool, as_json: bool) -> None:
    """Drain NAME, a host (`gpu-a`) or a GPU worker (`gpu0@gpu-a`): it stops taking jobs, and
    each job running there checkpoints and goes back to its queue. The drain holds across
    restarts until `clockq resume NAME`. With --wait, return once no job runs there."""
    api = connect(exact=as_json)
    path, what = _path(name, "drain")
    answer = api.post(path, {"reason": reason} if reason else None, shape=answers.HOST_OR_WORKER, what=what)
    if wait:
        answer = _wait_drained(api, name, answer, quiet=as_json)
    _show(answer, as_json)


@click.command()
@click.argument("name")
@json_option
def resume(name: str, as_json: bool) -> None:
    """Resume NAME, a drained host or GPU worker: it takes jobs again. A worker of a drained
    host resumes with its host."""
    path, what = _path(name, "resume")
    _show(connect(exact=as_json).post(path, shape=answers.HOST_OR_WORKER, what=what), as_json)


def _show(answer: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(answer)
        return
    workers = answer.get("workers")
    console().print(render.hosts_table([answer]) if workers is not None else render.fleet_workers_table([answer]))


def _wait_drained(
    api: Api,
    name: str,
    answer: dict[str, Any],
    *,
    quiet: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll until the drained host or worker runs no job (the API's word for a finished drain)."""
    path, what = _path(name)
    delay, told = FIRST_POLL_S, None
    while answer.get("running_jobs"):
        if not answer.get("drained"):
            raise CliError(f"{what} was resumed while draining", ExitCode.REFUSED)
        running = len(answer["running_jobs"])
        if not quiet and running != told:
            note(f"{what}: {running} job(s) still running")
            told = running
        sleep(delay)
        delay = min(delay * 1.5, MAX_POLL_S)
        answer = api.get(path, shape=answers.HOST_OR_WORKER, what=what)
    return answer
