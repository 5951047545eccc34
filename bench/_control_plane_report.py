"""bench/control_plane.py's figures: one phase's summary from its drivers' samples and the
servers' window (`summarise`), whether it kept up and what ran out if not (`verdict`), and the
printed report: the cadence phases' throughput, the cost phases' price of a boundary, and what
the goal (2,000 boundaries/s) would take of each server at the largest size."""

from __future__ import annotations

import math
import re
from collections import Counter

from _control_plane_stats import Window
from _harness import percentile

KEEPS_UP_SHARE = 0.95  # of the offered boundaries per second
LAG_SHARE = 0.1  # how late, as a share of the slice, a driver may start a GPU's actions and keep up
SATURATED = 0.9  # of a resource's capacity
# A Python process with many threads runs one at a time (the GIL), and loses some of its one core
# to handing it over: the drivers measured 0.85-0.89 cores where they could go no faster.
GIL_SATURATED = 0.85
LOCKED_SHARE = 0.25  # of the drivers' connections waiting for a row lock, on average
GOAL_PER_S = 2000
TOP = 8


def summarise(
    phase, drivers: list[dict], w: Window, control: dict, activity: list[tuple[int, int]], connections: int
) -> dict:
    values: dict[str, list[float]] = {}
    counts: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    first_errors: list[str] = []
    for d in drivers:
        for name, v in d["values"].items():
            values.setdefault(name, []).extend(v)
        counts.update(d["counts"])
        errors.update(d["errors"])
        first_errors += d["first_errors"]
    boundaries = len(values.get("boundary", []))
    driver_cpu = sum(d["cpu_s"] for d in drivers) / w.seconds
    return {
        "kind": phase.kind,
        "gpus": phase.gpus,
        "slice_s": phase.slice_s,
        "offered_per_s": phase.gpus / phase.slice_s,
        "boundaries_per_s": boundaries / w.seconds,
        "yields_per_s": len(values.get("yield", [])) / w.seconds,
        "claims_per_s": len(values.get("claim", [])) / w.seconds,
        "stale_per_s": len(values.get("stale", [])) / w.seconds,
        "latency_ms": {name: _pct(v) for name, v in sorted(values.items())},
        "counts": dict(counts),
        "errors": dict(errors),
        "first_errors": first_errors[:3],
        "cpu_cores": {
            "drivers": driver_cpu,
            "postgres": w.pg_cpu,
            "redis": w.redis_cpu,
            "control_and_coordinator": w.own_cpu,
            # Other processes on the machine: other sessions' tests, the kernel's own work.
            "other": w.machine_busy - w.pg_cpu - w.redis_cpu - w.own_cpu - driver_cpu,
            "machine_busy": w.machine_busy,
            "steal": w.steal,
            "machine_cores": w.cores,
        },
        "driver_processes": len(drivers),
        "connections": connections,  # the drivers' threads, one database connection each
        # Connections running a statement, and waiting for a row lock, on average over the window.
        "pg_active": sum(a for a, _ in activity) / len(activity) if activity else math.nan,
        "pg_lock_waits": sum(w for _, w in activity) / len(activity) if activity else math.nan,
        "per_boundary": _per_boundary(w, driver_cpu, boundaries),
        "redis_top": sorted(
            ([cmd, n / w.seconds, u / n] for cmd, (n, u) in w.redis_calls.items()), key=lambda c: -c[1] * c[2]
        )[:TOP],
        "postgres_top": [[_short(q), n / w.seconds, ms / n, plan / n] for q, n, ms, plan in w.pg_statements[:TOP]],
        "control_role": dict(control),
        "load_average": list(w.load),
        "window_s": w.seconds,
    }


def _per_boundary(w: Window, driver_cpu: float, boundaries: int) -> dict[str, float]:
    """What one boundary (with its claim, for a switch) cost each part, in ms of a core."""
    if not boundaries:
        return {}
    core_ms = 1000 * w.seconds / boundaries  # a core's ms per boundary
    return {
        "driver_cpu_ms": driver_cpu * core_ms,
        "postgres_cpu_ms": w.pg_cpu * core_ms,
        "redis_cpu_ms": w.redis_cpu * core_ms,
        "sql_statements": sum(n for _, n, _, _ in w.pg_statements) / boundaries,
        "sql_exec_ms": sum(ms for _, _, ms, _ in w.pg_statements) / boundaries,
        "sql_plan_ms": sum(plan for _, _, _, plan in w.pg_statements) / boundaries,
        "redis_commands": sum(n for n, _ in w.redis_calls.values()) / boundaries,
        "redis_usec": sum(u for _, u in w.redis_calls.values()) / boundaries,
    }


def _pct(values: list[float]) -> dict[str, float]:
    data = sorted(values)
    return {"n": len(data), "p50": percentile(data, 50), "p99": percentile(data, 99), "max": data[-1] if data else 0}


def _short(query: str, width: int = 100) -> str:
    return re.sub(r"\s+", " ", query)[:width]


def verdict(phase: dict) -> str:
    """Whether the fleet kept up, and if not, what ran out, from the measurements."""
    cpu = phase["cpu_cores"]
    lag = phase["latency_ms"].get("lag", {}).get("p99", math.nan)
    enough = phase["boundaries_per_s"] >= KEEPS_UP_SHARE * phase["offered_per_s"]
    if enough and lag < LAG_SHARE * phase["slice_s"] * 1000:
        return "keeps up"
    limits = []
    if cpu["redis"] >= SATURATED:
        limits.append(f"Redis's one thread ({cpu['redis']:.2f} cores)")
    if cpu["machine_busy"] >= SATURATED * cpu["machine_cores"]:
        limits.append(f"this machine's {cpu['machine_cores']} cores")
    if cpu["drivers"] >= GIL_SATURATED * phase["driver_processes"]:
        limits.append(f"the drivers' GIL ({cpu['drivers']:.2f} cores in {phase['driver_processes']} process(es))")
    if phase["pg_lock_waits"] >= LOCKED_SHARE * phase["connections"]:
        limits.append(f"row locks ({phase['pg_lock_waits']:.1f} of {phase['connections']} connections waiting for one)")
    return "saturated: " + ("; ".join(limits) or "nothing at its limit (latency: more --threads?)")


def one_line(p: dict) -> str:
    lat = p["latency_ms"]
    claim = lat.get("claim", {})
    return (
        f"{p['kind']:>7} {p['gpus']:>5} GPUs, slices of {p['slice_s']:.2f} s, {p['window_s']:.0f} s measured: "
        f"{p['boundaries_per_s']:7.1f} "
        f"boundaries/s of {p['offered_per_s']:.0f}, claim p50 {claim.get('p50', math.nan):.1f} "
        f"p99 {claim.get('p99', math.nan):.1f} ms, lag p99 {lat.get('lag', {}).get('p99', math.nan):.0f} ms, "
        f"errors {sum(p['errors'].values())}"
    )


def _ms(lat: dict, name: str) -> str:
    v = lat.get(name, {})
    return f"{v.get('p50', math.nan):.1f} / {v.get('p99', math.nan):.1f}"


def print_report(result: dict) -> None:
    args, phases = result["args"], result["phases"]
    print(
        f"\nControl plane: one Redis, one PostgreSQL (fsync {'on' if args['fsync'] else 'off'}); switch share "
        f"{args['switch_share']}, {args['jobs_per_gpu']:g} jobs per GPU, {args['users']} users, {args['procs']} "
        f"driver process(es) x {args['threads']} threads, Celery's traffic {'on' if args['celery'] else 'off'}, "
        f"{args['measure_s']:g} s measured per phase (longer for a small fleet, to see {args['min_claims']} claims)"
    )
    print(f"before: {result['uptime_before']}\nafter:  {result['uptime_after']}")
    cadence = [p for p in phases if p["kind"] == "cadence"]
    cost = [p for p in phases if p["kind"] == "cost"]
    base = phases[0]
    print(f"\nEvery GPU with a boundary every {args['slice_s']:g} s; the baseline is {base['gpus']} GPUs:\n")
    _print_throughput(cadence, base)
    print("\nWhat a boundary costs, in ms of a core (a yield with the next claim, when every boundary switches):\n")
    _print_costs([*cadence[:1], *cost] if cost else cadence, base)
    _print_goal(cost[-1] if cost else cadence[-1], args, result.get("freed_view", []))
    _print_freed(result.get("freed_view", []))
    for p in {id(p): p for p in (cadence[-1], cost[-1] if cost else cadence[-1])}.values():
        _print_details(p)
    for p in phases:
        if p["errors"]:
            print(f"errors at {p['gpus']} GPUs ({p['kind']}): {p['errors']}\nfirst: {p['first_errors']}")


def _print_throughput(phases: list[dict], base: dict) -> None:
    base_p99 = base["latency_ms"].get("claim", {}).get("p99", math.nan)
    print(
        "| GPUs | boundaries/s (offered) | claim p50 / p99 ms (p99 / baseline's) | boundary read p50 / p99 ms "
        "| write p50 / p99 ms (yield, else continue) | driver lag p99 ms | CPU cores: drivers / PostgreSQL / Redis "
        "/ other processes / machine busy | connections running / waiting for a lock | load (1 min) | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in phases:
        lat, cpu = p["latency_ms"], p["cpu_cores"]
        claim_p99 = lat.get("claim", {}).get("p99", math.nan)
        print(
            f"| {p['gpus']:,} | {p['boundaries_per_s']:,.0f} ({p['offered_per_s']:,.0f}) "
            f"| {_ms(lat, 'claim')} ({claim_p99 / base_p99:.1f}x) | {_ms(lat, 'read')} "
            f"| {_ms(lat, 'yield' if 'yield' in lat else 'continue')} "
            f"| {lat.get('lag', {}).get('p99', math.nan):,.0f} "
            f"| {cpu['drivers']:.2f} / {cpu['postgres']:.2f} / {cpu['redis']:.2f} / {cpu['other']:.2f} / "
            f"{cpu['machine_busy']:.2f} of {cpu['machine_cores']} | {p['pg_active']:.1f} / {p['pg_lock_waits']:.1f} "
            f"| {p['load_average'][0]:.2f} | {verdict(p)} |"
        )


def _print_costs(phases: list[dict], base: dict) -> None:
    base_p99 = base["latency_ms"].get("claim", {}).get("p99", math.nan)
    print(
        "| GPUs | slices | boundaries/s | claim p50 / p99 ms (p99 / baseline's) | driver CPU | PostgreSQL CPU "
        "| SQL statements | SQL exec + plan ms | Redis CPU | Redis commands | Redis usec | verdict |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in phases:
        b, lat = p["per_boundary"], p["latency_ms"]
        if not b:
            continue
        claim_p99 = lat.get("claim", {}).get("p99", math.nan)
        print(
            f"| {p['gpus']:,} | {p['slice_s']:.1f} s | {p['boundaries_per_s']:,.0f} "
            f"| {_ms(lat, 'claim')} ({claim_p99 / base_p99:.1f}x) | {b['driver_cpu_ms']:.2f} "
            f"| {b['postgres_cpu_ms']:.2f} | {b['sql_statements']:.1f} | {b['sql_exec_ms']:.2f} + "
            f"{b['sql_plan_ms']:.2f} | {b['redis_cpu_ms']:.3f} | {b['redis_commands']:.1f} | {b['redis_usec']:.0f} "
            f"| {verdict(p)} |"
        )


def _print_goal(p: dict, args: dict, freed: list[dict]) -> None:
    """What GOAL_PER_S boundaries would take of each part at this phase's costs per boundary. A
    stretched phase's freed-GPU set is smaller than the cadence's (every GPU in it): the read of
    a full one, measured apart, is added to Redis's part."""
    b = p.get("per_boundary")
    if not b:
        return
    rows = {row["members"]: row["eval_usec"] for row in freed}
    extra_usec = rows[p["gpus"]] - rows[min(rows)] if p["gpus"] in rows else 0.0
    redis_ms = b["redis_cpu_ms"] + extra_usec / 1000
    print(
        f"\nAt {p['gpus']:,} GPUs, {GOAL_PER_S:,} boundaries/s would take, at these costs: PostgreSQL "
        f"{GOAL_PER_S * b['postgres_cpu_ms'] / 1000:.1f} cores; Redis {GOAL_PER_S * redis_ms / 10:.0f} % of its "
        f"one thread ({b['redis_cpu_ms']:.3f} ms a boundary, and {extra_usec:.0f} usec more for a freed-GPU set of "
        f"{p['gpus']:,}); the GPU workers' own Python {GOAL_PER_S * b['driver_cpu_ms'] / 1000:.1f} cores in all, "
        f"spread over their hosts ({b['driver_cpu_ms'] / args['slice_s'] / 10:.1f} % of a core per GPU switching "
        f"every {args['slice_s']:g} s)."
    )


def _print_freed(rows: list[dict]) -> None:
    if rows:
        print("\nThe boundary's broker read against a freed-GPU set of N members (every GPU switching within 0.5 s):")
        for row in rows:
            print(
                f"  {row['members']:>5} members: the set's EVAL {row['eval_usec']:.0f} usec in Redis, "
                f"the read {row['read_ms']:.2f} ms in all (saw {row['seen']})"
            )


def _print_details(p: dict) -> None:
    print(f"\nAt {p['gpus']:,} GPUs ({p['kind']}), PostgreSQL's statements by total time (calls/s, exec, plan ms):")
    for query, per_s, ms, plan in p["postgres_top"]:
        print(f"  {per_s:7.1f}/s {ms:7.3f} {plan:6.3f}  {query}")
    print("Redis's commands by total time (calls/s, usec each):")
    for cmd, per_s, usec in p["redis_top"]:
        print(f"  {per_s:7.1f}/s {usec:7.1f}  {cmd}")
    control = p["control_role"]
    for name in ("reap", "reconcile"):
        if control.get(name):
            print(f"{name}: {len(control[name])} pass(es), {max(control[name]):.0f} ms at most")
    print(f"counts: {p['counts']}")
