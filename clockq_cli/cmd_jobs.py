"""`clockq submit`, `clockq jobs` and `clockq cancel`."""

from __future__ import annotations

import time
from typing import IO, Any

import click
from rich.live import Live

from clockq_cli import answers, render
from clockq_cli.client import Api, describe_refusal
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.jobfile import entry_labels, read_jobs
from clockq_cli.output import connect, console, emit_json, json_option, note
from clockq_cli.wait import wait_until_ended

TIERS = ("RT", "HP", "SP", "BP", "BK")
STATES = ("held", "queued", "running", "succeeded", "failed", "cancelled", "timed_out")
ACTIVE_STATES = ("held", "queued", "running")


@click.command(short_help="Submit jobs from a YAML or JSON file (like sbatch).")
@click.argument("job_file", type=click.File("r"))
@click.option("--tier", type=click.Choice(TIERS), help="Submit every job to this tier, whatever the file says.")
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    help="Every job needs this many GPUs at once, whatever the file says (without it: each job's "
    "own gpus, else 1). The server refuses more than the cluster can run, saying its largest.",
)
@click.option("--wait", is_flag=True, help="Wait until every job has ended; exit 6 unless all succeeded.")
@json_option
def submit(job_file: IO[str], tier: str | None, gpus: int | None, wait: bool, as_json: bool) -> None:
    """Submit the job or jobs in JOB_FILE (YAML or JSON; `-` reads stdin).

    A file holds one job or a list of them, each as the API takes it: name, tier, workload,
    params, and optionally deadline, gpu_mem_mib and gpus (how many GPUs it needs at once; 1 by
    default). A list is one batch: all are submitted, or none and every refused entry is named.
    """
    jobs = read_jobs(job_file, job_file.name, tier=tier, gpus=gpus)
    api = connect(exact=as_json)
    created = _submit_batch(api, jobs)
    if wait:
        created = _wait(api, created, quiet=as_json)
    if as_json:
        emit_json(created)
    else:
        console().print(render.jobs_table(created))
        for job in created:
            for line in render.job_notes(job):
                note(f"job {job['id']}: {line}")
    if wait:
        _fail_unless_all_succeeded(created)


def _submit_batch(api: Api, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return api.post("/api/jobs", jobs, shape=answers.JOBS)
    except CliError as exc:
        if exc.body is None:
            raise
        # The batch's refusal names entries by index: name them by the job's name too.
        raise CliError(describe_refusal(exc.body, labels=entry_labels(jobs))) from None


def _wait(api: Api, created: list[dict[str, Any]], *, quiet: bool) -> list[dict[str, Any]]:
    def heard(job: dict[str, Any]) -> None:
        if not quiet:
            note(f"job {job['id']} ({job['name']}): {job['state']}")

    try:
        if not quiet:
            note(f"submitted {_ids(created)}; waiting for the end (Ctrl-C stops waiting, not the jobs)")
        return wait_until_ended(api, created, on_change=heard)
    except KeyboardInterrupt:
        raise CliError(
            f"stopped waiting; jobs {_ids(created)} go on (`clockq jobs`, `clockq cancel`)", ExitCode.INTERRUPTED
        ) from None


def _fail_unless_all_succeeded(jobs: list[dict[str, Any]]) -> None:
    bad = [job for job in jobs if job["state"] != "succeeded"]
    if bad:
        what = ", ".join(
            f"job {j['id']} {j['state']}" + (f" ({render.error_line(j['last_error'])})" if j.get("last_error") else "")
            for j in bad
        )
        raise CliError(f"{len(bad)} of {len(jobs)} did not succeed: {what}", ExitCode.JOB_FAILED)


def _ids(jobs: list[dict[str, Any]]) -> str:
    return ", ".join(str(job["id"]) for job in jobs)


@click.command(short_help="List jobs, by default those not ended (like squeue).")
@click.option("--state", "states", multiple=True, type=click.Choice(STATES), help="Only jobs in this state (repeat).")
@click.option("--tier", type=click.Choice(TIERS), help="Only jobs in this tier now.")
@click.option("--user", help="Only this user's jobs (staff see everyone's; others only their own).")
@click.option("--all", "all_states", is_flag=True, help="Ended jobs too (default: held, queued and running).")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many.")
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C (with --json: a JSON line each time).")
@click.option("--interval", type=click.FloatRange(min=0.5), default=2.0, show_default=True, help="--watch: seconds.")
@json_option
def jobs(
    states: tuple[str, ...],
    tier: str | None,
    user: str | None,
    all_states: bool,
    limit: int,
    watch: bool,
    interval: float,
    as_json: bool,
) -> None:
    """List jobs, newest first, like squeue: by default the ones not ended."""
    if states and all_states:
        raise click.UsageError("--state and --all do not go together")
    params: dict[str, str] = {}
    if states or not all_states:
        params["state"] = ",".join(states or ACTIVE_STATES)
    if tier:
        params["tier"] = tier
    if user:
        params["owner"] = user
    api = connect(exact=as_json)
    if watch:
        _watch(api, params, limit=limit, interval=interval, as_json=as_json)
        return
    found, total = api.listing("/api/jobs", params, limit)
    if as_json:
        emit_json({"count": total, "jobs": found})
    else:
        console().print(render.jobs_table(found, title=_title(found, total)))


def _title(found: list[dict[str, Any]], total: int) -> str:
    return f"{total} jobs" if len(found) == total else f"{len(found)} newest of {total} jobs (--limit)"


def _watch(api: Api, params: dict[str, str], *, limit: int, interval: float, as_json: bool) -> None:
    """Read and show the list every `interval` s until Ctrl-C, which is the normal way out (exit 0).
    A server that cannot be reached for a while is retried, not the end of the watch."""
    out = console()
    live = Live(console=out, auto_refresh=False, transient=False) if out.is_terminal and not as_json else None
    try:
        if live is not None:
            live.start()
        while True:
            try:
                found, total = api.listing("/api/jobs", params, limit)
            except CliError as exc:
                if exc.exit_code != ExitCode.UNREACHABLE:
                    raise
                note(f"{exc.message}; trying again in {interval:g} s")  # a restart of the server, say
                time.sleep(interval)
                continue
            stamp = time.strftime("%H:%M:%S")
            if as_json:
                emit_json({"at": stamp, "count": total, "jobs": found}, compact=True)
            elif live is not None:
                live.update(render.jobs_table(found, title=f"{_title(found, total)} at {stamp}"), refresh=True)
            else:
                out.print(render.jobs_table(found, title=f"{_title(found, total)} at {stamp}"))
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


@click.command(short_help="Cancel jobs (like scancel).")
@click.argument("job_ids", nargs=-1, required=True, type=click.IntRange(min=1))
@json_option
def cancel(job_ids: tuple[int, ...], as_json: bool) -> None:
    """Cancel jobs, like scancel. Each is tried; the exit code tells the worst that happened
    (5 when one was not found, 1 when one had already ended)."""
    api = connect(exact=as_json)
    outcomes: list[dict[str, Any]] = []
    worst = ExitCode.OK
    for job_id in job_ids:
        try:
            job = api.post(api.job_path(job_id, "cancel"), shape=answers.JOB, what=f"job {job_id}")
            outcomes.append({"id": job_id, "cancelled": True, "state": job["state"]})
            if not as_json:
                click.echo(f"job {job_id} ({job['name']}): cancelled")
        except CliError as exc:
            if exc.exit_code not in (ExitCode.NOT_FOUND, ExitCode.REFUSED):
                raise  # unreachable, or the token refused: the next ones would fail the same way
            outcomes.append({"id": job_id, "cancelled": False, "error": exc.message})
            if not as_json:
                note(exc.message)
            worst = max(worst, ExitCode(exc.exit_code), key=_severity)
    if as_json:
        emit_json(outcomes)
    if worst != ExitCode.OK:
        raise SystemExit(int(worst))


def _severity(code: ExitCode) -> int:
    return {ExitCode.OK: 0, ExitCode.REFUSED: 1, ExitCode.NOT_FOUND: 2}[code]
