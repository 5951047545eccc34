"""`clockq show ID` and `clockq result ID [NAME] -o PATH`."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import click

from clockq_cli import answers, render
from clockq_cli.client import Api
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.output import connect, console, emit_json, json_option

# What the server allows a result file to be named (clockq/jobs/results.py), checked again here:
# a name from the server becomes a path on this machine.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
CHUNK_BYTES = 1 << 20


@click.command(short_help="A job in full (like scontrol show job).")
@click.argument("job_id", type=click.IntRange(min=1))
@json_option
def show(job_id: int, as_json: bool) -> None:
    """A job in full, like scontrol show job: its facts, slices, events, metrics and result files."""
    api = connect(exact=as_json)
    job = api.get(api.job_path(job_id), params={"history": 1}, shape=answers.JOB_DETAIL, what=f"job {job_id}")
    metrics = api.get(api.job_path(job_id, "metrics"), shape=answers.METRICS, what=f"job {job_id}")
    result = _result_or_none(api, job_id)
    if as_json:
        emit_json({"job": job, "metrics": metrics, "result": result})
    else:
        console().print(render.job_detail(job, metrics, result))


def _result_or_none(api: Api, job_id: int) -> dict[str, Any] | None:
    try:
        return api.get(api.job_path(job_id, "result"), shape=answers.RESULT, what=f"job {job_id}")
    except CliError as exc:
        if exc.exit_code == ExitCode.NOT_FOUND:
            return None  # the job was just read: this 404 means it has no result (yet)
        raise


@click.command(short_help="Download a job's result files, SHA-256 checked.")
@click.argument("job_id", type=click.IntRange(min=1))
@click.argument("name", required=False)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="With NAME: the file to write, or a folder to put it in. Without: the folder for every "
    "file (made if missing). Default: the current folder.",
)
@json_option
def result(job_id: int, name: str | None, output: Path | None, as_json: bool) -> None:
    """Download a finished job's result files, each checked against the SHA-256 the API gives.

    A file is written under a temporary name and renamed into place only once its size and
    SHA-256 match (exit 7 otherwise, and nothing is left behind); an existing file of that name
    is replaced.
    """
    # Exact: the manifest's names become file names here, checked against SAFE_NAME as they are.
    api = connect(exact=True)
    manifest = _manifest(api, job_id)
    files = manifest.get("files") or []
    if name is not None:
        files = [f for f in files if f.get("name") == name]
        if not files:
            listed = ", ".join(f.get("name", "?") for f in manifest.get("files") or [])
            raise CliError(f"job {job_id} has no result file {name!r}; it has: {listed}", ExitCode.NOT_FOUND)
    targets = _targets(files, output, single=name is not None)
    written = [_download(api, job_id, entry, target) for entry, target in targets]
    if as_json:
        emit_json(written)
    else:
        for w in written:
            click.echo(f"{w['path']}  {render.size(w['bytes'])}  sha256 {w['sha256']} (checked)")


def _manifest(api: Api, job_id: int) -> dict[str, Any]:
    try:
        return api.get(api.job_path(job_id, "result"), shape=answers.RESULT, what=f"job {job_id}")
    except CliError as exc:
        if exc.exit_code != ExitCode.NOT_FOUND:
            raise
        # Say which 404 it was: no such job, or a job without a result (yet).
        job = api.get(api.job_path(job_id), shape=answers.JOB, what=f"job {job_id}")
        raise CliError(f"job {job_id} is {job['state']} and has no result", ExitCode.NOT_FOUND) from None


def _targets(files: list[dict[str, Any]], output: Path | None, *, single: bool) -> list[tuple[dict[str, Any], Path]]:
    for entry in files:
        if not SAFE_NAME.fullmatch(str(entry.get("name", ""))):
            raise CliError(f"the server names a result file {entry.get('name')!r}: not a safe file name")
    if single and output is not None and not output.is_dir():
        return [(files[0], output)]
    folder = output if output is not None else Path.cwd()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot make the folder {folder}: {exc.strerror}", ExitCode.USAGE) from None
    return [(entry, folder / entry["name"]) for entry in files]


def _download(api: Api, job_id: int, entry: dict[str, Any], target: Path) -> dict[str, Any]:
    """Stream one file into a temporary file beside `target`, hashing as it comes; rename it into
    place only when its size and SHA-256 are the manifest's."""
    name, expected = entry["name"], str(entry.get("sha256", "")).lower()
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=target.parent)
    except OSError as exc:
        raise CliError(f"cannot write in {target.parent}: {exc.strerror}", ExitCode.USAGE) from None
    digest, size = hashlib.sha256(), 0
    try:
        with (
            os.fdopen(fd, "wb") as out,
            api.download(api.job_path(job_id, "result", name), what=f"file {name} of job {job_id}") as r,
        ):
            header = r.headers.get("X-Checksum-SHA256", "").lower()
            if header and header != expected:
                raise CliError(f"{name}: the download's SHA-256 header is not the manifest's", ExitCode.CHECKSUM)
            for chunk in r.iter_content(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if size > entry.get("bytes", 0):  # a server that sends more than it said: stop here
                    break
            out.flush()
            os.fchmod(out.fileno(), 0o666 & ~_umask())  # as an ordinary new file, not mkstemp's 0600
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != expected or size != entry.get("bytes"):
            raise CliError(
                f"{name}: got {size} bytes with SHA-256 {got}, the API gives {entry.get('bytes')} bytes "
                f"with {expected}; nothing was kept",
                ExitCode.CHECKSUM,
            )
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return {"name": name, "path": str(target), "bytes": size, "sha256": got, "verified": True}


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
