"""The comparison as text for a terminal."""

from __future__ import annotations

from typing import Any


def render(c: dict[str, Any]) -> str:
    """The comparison (compare()'s dict) as text: the run, the verdicts, /api/kpis, each job."""
    lines = [
        f"live vs simulator (clockq policy): {c['trace']}, {c['jobs']} jobs on {c['gpus']} GPU(s), "
        f"compressed x{c['compress']:g}, {c['step_ms']:g} ms steps, state capped at {c['state_kb_cap']} KB",
        f"  {c['multi_gpu_jobs']} multi-GPU job(s) ran as single-GPU jobs with the same duration, on both sides; "
        f"{c['capped_state_jobs']} job(s) had their state capped",
    ]
    lines += [f"  warning: {x}" for x in c["warnings"]]
    lines += ["", *_verdicts(c), *_kpi_lines(c.get("kpis"))]
    lines += ["", "per job (seconds from the first submission; live: the server's clock):", *_per_job_table(c)]
    lines += ["", "mapping:", *(f"  {m}" for m in c["mapping"])]
    return "\n".join(lines) + "\n"


def _verdicts(c: dict[str, Any]) -> list[str]:
    o, w, u = c["start_order"], c["wait_mean_s"], c["utilisation"]
    tau = "-" if o["kendall_tau"] is None else f"{o['kendall_tau']:.3f}"
    verdict = "the same" if o["same"] else f"{o['discordant']} of {o['pairs']} pairs in a different order"
    lines = [
        f"start order: {verdict} (Kendall tau {tau}, over {o['jobs']} jobs started on both sides)",
        f"  sim : {' '.join(o['sim'])}",
        f"  live: {' '.join(o['live'])}",
    ]
    for side in ("sim", "live"):
        if o["not_started"][side]:
            lines.append(f"  never started ({side}): {' '.join(o['not_started'][side])}")
    diff = "" if w["diff"] is None else f" ({w['diff']:+.2f} s)"
    jct = c["jct_mean_s"]
    return [
        *lines,
        f"mean wait:   sim {_s(w['sim'])} s over {w['sim_started']}, "
        f"live {_s(w['live'])} s over {w['live_started']}{diff}",
        f"mean JCT:    sim {_s(jct['sim'])} s, live {_s(jct['live'])} s, over {jct['jobs']} jobs done on both sides",
        f"utilisation: sim {_pct(u['sim']['busy'])} computing, {_pct(u['sim']['held'])} held, "
        f"over {_s(u['sim']['span_s'], 1)} s; live {_pct(u['live']['busy'])} computing, "
        f"{_pct(u['live']['held'])} held, over {_s(u['live']['span_s'], 1)} s",
        f"ended:       sim {c['states']['sim']}, live {c['states']['live']}",
        f"switches:    sim {c['switches']['sim_preemptions']} yields (turns and RT preemptions) and "
        f"{c['switches']['sim_promotions']} promotions; live {c['switches']['live_yields']} yields and "
        f"{c['switches']['live_promotions']} promotions, {c['switches']['live_holds']} holds",
        f"service:     ladder {_rungs(c['rungs']['ladder_s'])} s; jobs past their tier's first rung: "
        f"sim {c['rungs']['sim_past_first_rung']}, live {c['rungs']['live_past_first_rung']}",
        f"submission:  {_s(c['submit_lag_s']['mean'], 3)} s late on average, at most "
        f"{_s(c['submit_lag_s']['max'], 3)} s",
    ]


def _kpi_lines(k: dict[str, Any] | None) -> list[str]:
    if not k:
        return []
    if "error" in k:
        return [f"/api/kpis: {k['error']}"]
    ov = k["overall"]
    cover = "covers the run" if k["covered"] else "does NOT cover the whole run yet (rollup every 60 s)"
    lines = [
        f"/api/kpis {k['since']} .. {k['until']} (rolled up until {k['rolled_up_until']}: {cover}; "
        f"every job in those minutes counts): started {ov['started']}, wait mean {_s(ov['wait_mean_s'])} s, "
        f"p95 {_s(ov['wait_p95_s'])} s, GPU busy share {_pct(k['gpu_busy_share'])}"
    ]
    for code, t in k["tiers"].items():
        if t["started"]:
            waits = f"wait mean {_s(t['wait_mean_s'])} s, p95 {_s(t['wait_p95_s'])} s"
            lines.append(f"  {code}: started {t['started']}, {waits}")
    return lines


def _per_job_table(c: dict[str, Any]) -> list[str]:
    header = (
        "job",
        "tier",
        "submit",
        "live sub",
        "sim start",
        "live start",
        "sim wait",
        "live wait",
        "pos s/l",
        "sim end",
        "live end",
        "live state",
    )
    rows = [
        (
            r["key"],
            r["tier"],
            _s(r["submit_s"]),
            _s(r["live_submit_s"]),
            _s(r["sim_start_s"]),
            _s(r["live_start_s"]),
            _s(r["sim_wait_s"]),
            _s(r["live_wait_s"]),
            f"{r['sim_pos'] or '-'}/{r['live_pos'] or '-'}",
            _s(r["sim_finish_s"]),
            _s(r["live_finish_s"]),
            r["live_state"],
        )
        for r in c["per_job"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = []
    for row in (header, *rows):  # key and tier to the left, numbers to the right
        cells = (
            str(x).ljust(n) if i < 2 else str(x).rjust(n) for i, (x, n) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("  " + "  ".join(cells))
    return lines


def _rungs(ladder: list[float]) -> str:
    return ",".join(f"{rung:.12g}" for rung in ladder)


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
