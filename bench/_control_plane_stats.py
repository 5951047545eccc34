"""What bench/control_plane.py reads from the servers and the machine around a measured window:
Redis's own counters (INFO commandstats and cpu), PostgreSQL's (pg_stat_statements, and the
CPU time of the postmaster and its backends from /proc), and the machine's CPU (/proc/stat).
A snapshot is taken at each end of the window; `between` turns two into rates and shares."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import redis

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class Snapshot:
    at: float
    redis_calls: dict[str, tuple[int, float]]  # command -> (calls, usec)
    redis_cpu_s: float
    pg_statements: dict[int, tuple[str, int, float, float]]  # queryid -> (query, calls, exec ms, plan ms)
    pg_cpu_s: float
    machine: tuple[float, float, float]  # busy, steal, total (s of CPU, all cores)
    own_cpu_s: float  # this process: the control role's passes and the coordinator
    load: tuple[float, float, float]


@dataclass
class Window:
    seconds: float
    redis_cpu: float  # cores
    pg_cpu: float
    own_cpu: float
    machine_busy: float  # cores busy, of `cores`
    steal: float
    cores: int
    redis_calls: dict[str, tuple[int, float]]  # command -> (calls, usec) in the window
    # (query, calls, exec ms, plan ms) in the window, by total time, top first
    pg_statements: list[tuple[str, int, float, float]] = field(default_factory=list)
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)  # at the window's end


def snapshot(r: redis.Redis, cursor, postmaster: int) -> Snapshot:
    return Snapshot(
        at=time.time(),
        redis_calls=redis_commandstats(r),
        redis_cpu_s=redis_cpu_s(r),
        pg_statements=pg_statements(cursor),
        pg_cpu_s=process_tree_cpu_s(postmaster),
        machine=machine_cpu_s(),
        own_cpu_s=sum(os.times()[:2]),
        load=os.getloadavg(),
    )


def between(a: Snapshot, b: Snapshot) -> Window:
    wall = max(b.at - a.at, 1e-9)
    calls = {}
    for cmd, (n, usec) in b.redis_calls.items():
        n0, usec0 = a.redis_calls.get(cmd, (0, 0.0))
        if n > n0:
            calls[cmd] = (n - n0, usec - usec0)
    statements = []
    for qid, (query, n, ms, plan) in b.pg_statements.items():
        _, n0, ms0, plan0 = a.pg_statements.get(qid, (query, 0, 0.0, 0.0))
        if n > n0:
            statements.append((query, n - n0, ms - ms0, plan - plan0))
    statements.sort(key=lambda s: -(s[2] + s[3]))
    busy, steal, _total = (y - x for x, y in zip(a.machine, b.machine, strict=True))
    return Window(
        seconds=wall,
        redis_cpu=(b.redis_cpu_s - a.redis_cpu_s) / wall,
        pg_cpu=(b.pg_cpu_s - a.pg_cpu_s) / wall,
        own_cpu=(b.own_cpu_s - a.own_cpu_s) / wall,
        machine_busy=busy / wall,
        steal=steal / wall,
        cores=os.cpu_count() or 1,
        redis_calls=calls,
        pg_statements=statements,
        load=b.load,
    )


def redis_commandstats(r: redis.Redis) -> dict[str, tuple[int, float]]:
    stats = r.info("commandstats")
    return {key.removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"])) for key, v in stats.items()}


def redis_cpu_s(r: redis.Redis) -> float:
    cpu = r.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def pg_statements(cursor) -> dict[int, tuple[str, int, float, float]]:
    cursor.execute(
        "SELECT queryid, query, calls, total_exec_time, total_plan_time FROM pg_stat_statements "
        "WHERE queryid IS NOT NULL"
    )
    return {int(qid): (query, int(n), float(ms), float(plan)) for qid, query, n, ms, plan in cursor.fetchall()}


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # the fields after the command's name


def process_tree_cpu_s(root: int) -> float:
    """CPU time of `root` and its children: the live ones' own, and that of the children it has
    reaped already (cutime, cstime), so a backend that exits in the window is not lost."""
    fields = _stat_fields(root)
    if fields is None:
        return 0.0
    ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = _stat_fields(int(entry))
            if child is not None and int(child[1]) == root:  # its ppid
                ticks += int(child[11]) + int(child[12])
    return ticks * TICK_S


def machine_cpu_s() -> tuple[float, float, float]:
    """(busy, steal, total) CPU seconds of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as fh:
        values = [int(x) for x in fh.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    busy = user + nice + system + irq + softirq
    return busy * TICK_S, steal * TICK_S, sum(values) * TICK_S


def postmaster_pid(cursor) -> int:
    """The postmaster: the parent of this connection's backend."""
    cursor.execute("SELECT pg_backend_pid()")
    backend = int(cursor.fetchone()[0])
    fields = _stat_fields(backend)
    if fields is None:
        raise RuntimeError("cannot read the PostgreSQL backend's /proc entry (is the server on this machine?)")
    return int(fields[1])


def pg_activity(cursor) -> tuple[int, int]:
    """(backends running a statement, those of them waiting for a lock) right now."""
    cursor.execute(
        "SELECT count(*) FILTER (WHERE state = 'active'), "
        "count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock') "
        "FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    active, waiting = cursor.fetchone()
    return int(active), int(waiting)
