"""Issue 11's forecast benchmark: `evaluate_predictor` on every series in ../shared/data/load/,
horizon 15 minutes, seed 0, and one table.

Features are chosen by one rule for every series, never tuned per series (the predictor is also
judged on series it has not seen): the target is the cluster's load as a fraction, and the
features are that load and the cluster's other utilisation signals.

- CPU clusters (Alibaba 2018, Google 2019): target CPU utilisation; features CPU and memory
  utilisation (padded to CPU, memory, CPU).
- GPU clusters (Helios): target GPU demand (running + pending GPUs) / GPUs, the load index
  the controller forecasts; features the allocation (running / GPUs), the waiting demand (pending / GPUs) and
  the demand itself. The allocation ratio running / GPUs is evaluated as a second target with
  the same features.

Usage: .venv/bin/python bench/evaluate_predictor.py [--markdown] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "data" / "load"

ALLOCATION = "running_gpu_num/total_gpu_num"
DEMAND = "(running_gpu_num+pending_gpu_num)/total_gpu_num"
GPU_FEATURES = [ALLOCATION, "pending_gpu_num/total_gpu_num", DEMAND]

# (label, file, interval, features, target)
SERIES = [
    ("alibaba2018 300s cpu", "alibaba2018_cluster_300s.csv", "300s",
     ["cpu_util_percent/100", "mem_util_percent/100"], "cpu_util_percent/100"),
    ("alibaba2018 30s cpu", "alibaba2018_cluster_30s.csv", "30s",
     ["cpu_util_percent/100", "mem_util_percent/100"], "cpu_util_percent/100"),
    ("google2019 300s cpu", "google2019_cluster_300s.csv", "300s", ["avg_cpu", "avg_mem"], "avg_cpu"),
]  # fmt: skip
for vc in ("vc3sl", "vc6YE", "vchbv", "vcpDC"):
    SERIES.append((f"helios {vc} demand", f"helios_earth_{vc}_1min.csv", "60s", GPU_FEATURES, DEMAND))
    SERIES.append((f"helios {vc} allocation", f"helios_earth_{vc}_1min.csv", "60s", GPU_FEATURES, ALLOCATION))


def budget(report: dict) -> str:
    return ", time budget" if report["lstm"]["stopped_by_time_budget"] else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--only", default="", help="run only the series whose label contains this")
    parser.add_argument("--json-out", default="", help="also write every report to this JSON file")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clockq.settings")
    import django

    django.setup()
    from django.core.management import call_command

    reports = {}
    rows = []
    for label, name, interval, features, target in SERIES:
        if args.only and args.only not in label:
            continue
        out = io.StringIO()
        started = time.perf_counter()
        call_command(
            "evaluate_predictor", str(DATA / name), "--features", *features, "--target", target,
            "--interval", interval, "--horizon", "15m", "--seed", "0", "--json", stdout=out,
        )  # fmt: skip
        report = json.loads(out.getvalue())
        report["wall_seconds"] = round(time.perf_counter() - started, 1)
        reports[label] = report
        rows.append((label, report))
        print(f"done: {label} in {report['wall_seconds']} s", file=sys.stderr, flush=True)

    head = ["series", "rows", "persistence MAE", "linear MAE", "LSTM MAE", "champion", "champion MAE",
            "champion vs persistence", "LSTM vs persistence", "bucket acc. (persistence / champion)",
            "LSTM latency ms (median / p95)", "LSTM training s (epochs)"]  # fmt: skip
    lines = []
    for label, r in rows:
        lines.append([
            label, str(r["split"]["rows"]),
            f"{r['persistence']['mae']:.4f}", f"{r['linear']['mae']:.4f}", f"{r['lstm']['mae']:.4f}",
            r["champion"]["model"], f"{r['champion']['mae']:.4f}",
            f"{r['champion']['improvement_pct']:+.1f}%", f"{r['lstm']['improvement_pct']:+.1f}%",
            f"{r['persistence']['bucket_accuracy']:.1%} / {r['champion']['bucket_accuracy']:.1%}",
            f"{r['lstm']['latency_ms']['median']:.2f} / {r['lstm']['latency_ms']['p95']:.2f}",
            f"{r['lstm']['fit_seconds']:.1f} ({r['lstm']['epochs']}{budget(r)})",
        ])  # fmt: skip
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for line in lines:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(reports, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
