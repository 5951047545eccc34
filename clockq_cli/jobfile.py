"""A job file: one job (a mapping) or a list of them, in YAML or JSON, as the API's submit takes
them (`name`, `tier`, `workload`, `params`, `deadline`, `gpu_mem_mib`, `gpus`). The CLI checks only
the shape; the server checks every field and names what it refuses, so the two never disagree on
what a field may be (how many GPUs a job may ask for depends on the cluster, which only it knows)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import IO, Any

import yaml

from clockq_cli.exits import CliError, ExitCode


def read_jobs(source: IO[str], name: str, *, tier: str | None = None, gpus: int | None = None) -> list[dict[str, Any]]:
    """The jobs in `source` (a file named `name`, or stdin as "-"), each with `tier` and `gpus` set
    when given, whatever the file says (the command line's options win, as sbatch's do)."""
    try:
        text = source.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {name}: {exc}", ExitCode.USAGE) from None
    data = _plain(_parse(text, name))
    jobs = data if isinstance(data, list) else [data]
    if not jobs:
        raise CliError(f"{name} lists no job", ExitCode.USAGE)
    for index, job in enumerate(jobs):
        if not isinstance(job, dict):
            where = f"entry {index} of {name}" if isinstance(data, list) else name
            raise CliError(f"{where} is not a job (a mapping of name, tier, workload, params)", ExitCode.USAGE)
    overrides = {key: value for key, value in (("tier", tier), ("gpus", gpus)) if value is not None}
    return [{**job, **overrides} for job in jobs]


def entry_labels(jobs: list[dict[str, Any]]) -> dict[str, str]:
    """How to name each entry in the server's refusal: its index and, when it has one, its name."""
    return {str(i): f"entry {i} ({job['name']})" if job.get("name") else f"entry {i}" for i, job in enumerate(jobs)}


def _parse(text: str, name: str) -> Any:
    try:
        if Path(name).suffix.lower() == ".json":
            return json.loads(text)
        # YAML: JSON is YAML too, so stdin may be either. safe_load builds plain data only.
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        where = f" at line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise CliError(f"{name} does not parse: {exc.problem or exc.context}{where}", ExitCode.USAGE) from None
    except (ValueError, yaml.YAMLError) as exc:
        raise CliError(f"{name} does not parse: {str(exc)[:200]}", ExitCode.USAGE) from None


def _plain(data: Any) -> Any:
    """YAML reads `deadline: 2026-12-31T18:00:00Z` as a datetime: back to the ISO text the API takes."""
    if isinstance(data, datetime.date):
        return data.isoformat()
    if isinstance(data, dict):
        return {key: _plain(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_plain(value) for value in data]
    return data
