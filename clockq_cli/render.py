"""The API's answers as Rich tables. Each function takes the JSON as the API gave it."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

SHOWN_ROWS = 20  # slices and events `clockq show` lists (the newest; --json has all)

STATE_STYLES = {
    "held": "magenta",
    "queued": "yellow",
    "running": "cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "dim",
    "timed_out": "red",
}


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 1:
        return f"{ms:.0f} ms"
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def when(iso: str | None) -> str:
    """An API timestamp in local time: the time alone today, with the date otherwise."""
    if not iso:
        return "-"
    try:
        at = datetime.fromisoformat(iso).astimezone()
    except (ValueError, OverflowError, OSError):  # not a time, or one beyond what a date holds
        return iso
    return at.strftime("%H:%M:%S" if at.date() == datetime.now().astimezone().date() else "%Y-%m-%d %H:%M")


def share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def state(value: str) -> Text:
    return Text(value, style=STATE_STYLES.get(value, ""))


def tier(job: dict[str, Any]) -> str:
    """The tier a job is in now, and the one it came from when it was promoted."""
    now, original = job.get("tier"), job.get("original_tier")
    return f"{now} (from {original})" if original and original != now else str(now)


def gpu_count(job: dict[str, Any]) -> str:
    """How many GPUs a job needs at once; a server older than multi-GPU jobs says nothing: 1."""
    count = job.get("gpus")
    return "1" if count is None else str(count)


def jobs_table(jobs: list[dict[str, Any]], *, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for name, justify in [
        ("ID", "right"),
        ("NAME", "left"),
        ("USER", "left"),
        ("TIER", "left"),
        ("GPUS", "right"),
        ("STATE", "left"),
        ("PROGRESS", "right"),
        ("WAIT", "right"),
        ("RUN", "right"),
        ("WORKER", "left"),
        ("SUBMITTED", "left"),
    ]:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for job in jobs:
        table.add_row(
            str(job["id"]),
            job["name"],
            job["owner"],
            tier(job),
            gpu_count(job),
            state(job["state"]),
            share(job.get("progress")),
            duration(job.get("wait_ms")),
            duration(job.get("run_ms")),
            job.get("worker") or "-",
            when(job.get("submitted_at")),
        )
    return table


def job_notes(job: dict[str, Any]) -> list[str]:
    """Why a job waits or how it ended, in the job's own words (admission, placement, error)."""
    notes = [job.get("admission_note"), job.get("placement_note")]
    if job.get("last_error"):
        notes.append(f"last error: {error_line(job['last_error'])}")
    return [str(n) for n in notes if n]


def error_line(error: str) -> str:
    """A job's last error (a traceback) in one line: its last, which names the exception."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def job_detail(job: dict[str, Any], metrics: dict[str, Any] | None, result: dict[str, Any] | None) -> Group:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column(overflow="fold")
    rows = [
        ("job", f"{job['id']} {job['name']}"),
        ("state", state(job["state"])),
        ("owner", job["owner"]),
        ("tier", tier(job)),
        ("gpus", gpu_count(job)),
        ("workload", f"{job['workload']} {json.dumps(job.get('params') or {})}"),
        ("progress", share(job.get("progress"))),
        ("submitted", when(job.get("submitted_at"))),
        ("first started", when(job.get("first_started_at"))),
        ("finished", when(job.get("finished_at"))),
        ("deadline", when(job.get("deadline"))),
        ("waited, ran", f"{duration(job.get('wait_ms'))}, {duration(job.get('run_ms'))}"),
        ("slices", str(job.get("slices", 0))),
        ("checkpoint", f"generation {job.get('checkpoint_generation')}"),
        ("failures", str(job.get("failures", 0))),
        ("worker", job.get("worker") or "-"),
    ]
    if job.get("pending_action"):
        rows.append(("pending", job["pending_action"]))
    rows += [("note", n) for n in job_notes(job)]
    for label, value in rows:
        facts.add_row(label, value)
    parts: list[RenderableType] = [facts]
    parts += _slices(job.get("slice_history") or [])
    parts += _events(job.get("events") or [])
    parts += _metrics(metrics)
    if job.get("last_error"):
        # Staff get the whole traceback (`last_error_traceback`); everyone else, its last line.
        error = job.get("last_error_traceback") or job["last_error"]
        parts += [Text("\nlast error", style="bold"), Text(error.rstrip())]
    parts.append(result_table(result) if result else Text("\nno result (yet)", style="dim"))
    return Group(*parts)


def _newest(rows: list[dict[str, Any]], what: str) -> tuple[list[dict[str, Any]], str]:
    hidden = len(rows) - SHOWN_ROWS
    title = f"{what} ({hidden} earlier not shown; --json has all)" if hidden > 0 else what
    return rows[-SHOWN_ROWS:], title


def _slices(slices: list[dict[str, Any]]) -> list[RenderableType]:
    if not slices:
        return []
    shown, title = _newest(slices, "slices")
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for name in ("STARTED", "WORKER", "GPU", "PLANNED", "USED", "STEPS", "OUTCOME", "CKPT", "RESTORE", "UTIL"):
        table.add_column(name, overflow="fold")
    for s in shown:
        table.add_row(
            when(s.get("started_at")),
            s.get("worker") or "-",
            str(s.get("gpu_index", "-")),
            duration(s.get("planned_ms")),
            duration(s.get("used_ms")),
            str(s.get("steps") or 0),
            (s.get("outcome") or "running") + (" (rolled back)" if s.get("rolled_back") else ""),
            duration(s.get("checkpoint_ms")),
            duration(s.get("restore_ms")),
            share(s.get("gpu_util")),
        )
    return [Text(""), table]


def _events(events: list[dict[str, Any]]) -> list[RenderableType]:
    if not events:
        return []
    shown, title = _newest(events, "events")
    table = Table(title=title, title_justify="left", box=None, header_style="bold")
    for name in ("AT", "CHANGE", "REASON", "BY"):
        table.add_column(name, overflow="fold")
    for e in shown:
        change = f"{e.get('from_state') or '-'} -> {e.get('to_state')}"
        table.add_row(when(e.get("at")), change, e.get("reason") or "", e.get("actor") or "")
    return [Text(""), table]


def _metrics(metrics: dict[str, Any] | None) -> list[RenderableType]:
    curves = (metrics or {}).get("metrics") or {}
    if not curves:
        return []
    table = Table(title="metrics", title_justify="left", box=None, header_style="bold")
    for name, justify in [("NAME", "left"), ("POINTS", "right"), ("LATEST STEP", "right"), ("LATEST", "right")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for name, curve in sorted(curves.items()):
        step, value = [*(curve.get("latest") or []), None, None][:2]
        table.add_row(name, str(len(curve.get("points") or [])), _number(step), _number(value))
    return [Text(""), table]


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def result_table(result: dict[str, Any]) -> Table:
    table = Table(title=f"result ({size(result.get('bytes'))})", title_justify="left", box=None, header_style="bold")
    table.add_column("FILE", overflow="fold")
    table.add_column("SIZE", justify="right")
    table.add_column("SHA-256", overflow="fold")
    for f in result.get("files") or []:
        table.add_row(f["name"], size(f.get("bytes")), f.get("sha256", ""))
    return table


def queues_tables(answer: dict[str, Any]) -> Group:
    tiers = Table(title="tiers", title_justify="left", box=None, header_style="bold")
    for name, justify in [
        ("TIER", "left"),
        ("QUEUE", "left"),
        ("WAITING", "right"),
        ("RUNNING", "right"),
        ("HELD", "right"),
        ("WAIT TARGET", "right"),
        ("FOR", "left"),
    ]:
        tiers.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for t in answer.get("tiers") or []:
        tiers.add_row(
            t["tier"],
            t.get("queue", ""),
            str(t.get("waiting", 0)),
            str(t.get("running", 0)),
            str(t.get("held", 0)),
            duration(t.get("wait_target_ms")),
            t.get("use") or "",
        )
    workers = answer.get("workers")
    if workers is None:
        return Group(tiers, Text("\nworkers: unknown (the server cannot read its broker)", style="red"))
    return Group(tiers, Text(""), workers_table(workers))


def workers_table(workers: list[dict[str, Any]]) -> Table:
    table = Table(title=f"live workers ({len(workers)})", title_justify="left", box=None, header_style="bold")
    for name in ("WORKER", "GPU", "HOST", "UP SINCE", "DRAINED", "DEGRADED"):
        table.add_column(name, overflow="fold")
    for w in sorted(workers, key=lambda w: str(w.get("hostname"))):
        started = w.get("started")
        table.add_row(
            str(w.get("hostname", "?")),
            "-" if w.get("gpu") is None else str(w["gpu"]),
            str(w.get("host", "")),
            _since(started),
            Text(w["drained"] if isinstance(w.get("drained"), str) else "drained", style="yellow")
            if w.get("drained")
            else "",
            Text(str(w["degraded"]), style="red") if w.get("degraded") else "",
        )
    return table


def _since(started: Any) -> str:
    """A heartbeat's start (seconds since the epoch) as `when` shows a time; "-" if it is none."""
    try:
        return when(datetime.fromtimestamp(started).isoformat())
    except (TypeError, ValueError, OverflowError, OSError):
        return "-"


def _drain(item: dict[str, Any]) -> Text | str:
    if not item.get("drained"):
        return ""
    by, reason = item.get("drained_by") or "?", item.get("drain_reason")
    return Text(f"by {by}" + (f": {reason}" if reason else ""), style="yellow")


def hosts_table(hosts: list[dict[str, Any]]) -> Group:
    """Each host with its drain, then every GPU worker of theirs."""
    table = Table(title=f"hosts ({len(hosts)})", title_justify="left", box=None, header_style="bold")
    for name in ("HOST", "LIVE", "ROLES", "RUNNING", "DRAINED"):
        table.add_column(name, overflow="fold")
    workers: list[dict[str, Any]] = []
    for h in sorted(hosts, key=lambda h: str(h.get("name"))):
        table.add_row(
            str(h.get("name")),
            "yes" if h.get("live") else Text("no", style="red"),
            ",".join(h.get("roles") or []),
            str(len(h.get("running_jobs") or [])),
            _drain(h),
        )
        workers += h.get("workers") or []
    return Group(table, Text(""), fleet_workers_table(workers))


def fleet_workers_table(workers: list[dict[str, Any]]) -> Table:
    table = Table(title=f"GPU workers ({len(workers)})", title_justify="left", box=None, header_style="bold")
    for name in ("WORKER", "LIVE", "TAKING JOBS", "RUNNING", "DRAINED"):
        table.add_column(name, overflow="fold")
    for w in sorted(workers, key=lambda w: str(w.get("name"))):
        consuming = w.get("consuming")
        table.add_row(
            str(w.get("name")),
            "?" if w.get("live") is None else ("yes" if w["live"] else Text("no", style="red")),
            "-" if consuming is None else ("yes" if consuming else "no"),
            ",".join(str(j) for j in w.get("running_jobs") or []) or "-",
            _drain(w),
        )
    return table


def gpus_table(answer: dict[str, Any]) -> Table:
    gpus = answer.get("gpus") or []
    now = answer.get("now") or time.time()
    table = Table(title=f"GPUs ({len(gpus)})", title_justify="left", box=None, header_style="bold")
    for name, justify in [
        ("HOST", "left"),
        ("GPU", "right"),
        ("UTIL", "right"),
        ("MEMORY", "right"),
        ("MEM BUSY", "right"),
        ("POWER", "right"),
        ("TEMP", "right"),
        ("PROCS", "right"),
        ("AGE", "right"),
        ("NOTE", "left"),
    ]:
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for g in sorted(gpus, key=lambda g: (str(g.get("host")), g.get("gpu_index", 0))):
        used, total = g.get("mem_used_mib"), g.get("mem_total_mib")
        memory = "-" if used is None or total is None else f"{used}/{total} MiB"
        notes = ["simulated"] if g.get("simulated") else []
        if g.get("error"):
            notes.append(str(g["error"]))
        table.add_row(
            str(g.get("host")),
            str(g.get("gpu_index")),
            share(g.get("gpu_util")),
            memory,
            share(g.get("mem_util")),
            "-" if g.get("power_w") is None else f"{g['power_w']:.0f} W",
            "-" if g.get("temperature_c") is None else f"{g['temperature_c']:.0f} C",
            "-" if g.get("process_count") is None else str(g["process_count"]),
            f"{max(now - g.get('ts', now), 0):.0f} s",
            "; ".join(notes),
        )
    return table
