"""clockq's Grafana dashboard, as code: `python compose/grafana/generate.py` writes
compose/grafana/dashboards/clockq.json, which Grafana's provisioning loads (docs/monitoring.md,
Grafana). Built with Grafana Labs' grafana-foundation-sdk (requirements-dev.txt).

Every query reads the recording rules of compose/prometheus/rules/ or a metric of clockq's
/metrics; tests/compose/test_grafana_dashboards.py checks that, that each query parses, and that
the JSON here is what this file generates. The live Prometheus test runs each query.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common, prometheus, stat, statetimeline, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row, ThresholdsConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    ValueMap,
    ValueMappingResult,
)

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "dashboards" / "clockq.json"
# The provisioned data source (provisioning/datasources/prometheus.yml).
DATASOURCE = DataSourceRef(type_val="prometheus", uid="clockq-prometheus")
# The control rules' thresholds on the forecast load (clockq/policy/control.py): prefetch under
# 30%, scale out over 70%, admission closed over 85%.
LOAD_THRESHOLDS = ((0.30, "blue"), (0.70, "orange"), (0.85, "red"))


def query(expr: str, legend: str = "__auto") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).range()


def with_queries(panel, *queries: prometheus.Dataquery):
    """The queries, named A, B, C... as Grafana names them (each panel's must differ)."""
    for i, q in enumerate(queries):
        panel = panel.with_target(q.ref_id(chr(ord("A") + i)))
    return panel


def series(title: str, description: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
    panel = panel.line_width(1).fill_opacity(10).span(12).height(8)
    panel = panel.legend(common.VizLegendOptions().show_legend(True).display_mode("list").placement("bottom"))
    return with_queries(panel, *queries)


def dashed() -> list[DynamicConfigValue]:
    return [DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})]


def queues_and_service_levels() -> list[timeseries.Panel]:
    return [
        series(
            "Queue depth per tier",
            "Jobs waiting to run, by current tier (a promoted job counts in its higher tier).",
            "short",
            query("tier:clockq_queue_depth:max", "{{tier}}"),
        ).stacking(common.StackingConfig().mode("normal")),
        series(
            "Wait to first start (p95, 15 min) against each tier's target",
            "Solid: the p95 of the waits from submission to first start of the jobs that started in the last "
            "15 minutes. Dashed: the tier's target (its SLO). Over the target: ClockqTierWaitsOverSlo.",
            "s",
            query("tier:clockq_job_first_wait_seconds:p95_15m", "{{tier}} p95"),
            query("tier:clockq_tier_wait_target_seconds:max", "{{tier}} target"),
        )
        .scale_distribution(common.ScaleDistributionConfig().type("log").log(10))
        .override_by_regexp(".* target", dashed()),
        series(
            "Longest wait of a job not started yet, against the target",
            "The oldest never-started job's wait over its tier's target: 100% is at the target. Over it for 5 "
            "minutes: ClockqJobWaitingPastSlo.",
            "percentunit",
            query(
                "tier:clockq_queue_oldest_wait_seconds:max / on (tier) tier:clockq_tier_wait_target_seconds:max",
                "{{tier}}",
            ),
        ),
        series(
            "On-time rate per tier (1 h)",
            "On-time jobs / (succeeded + failed + timed out) over the last hour, by the job's own tier: the KPIs' "
            "definition (a deadline met, or without one the first wait within the target).",
            "percentunit",
            query("tier:clockq_on_time:ratio_1h", "{{tier}}"),
        )
        .min(0)
        .max(1),
    ]


def gpus_and_slices() -> list[timeseries.Panel]:
    return [
        series(
            "GPU utilisation per host",
            "Mean NVML utilisation of each host's GPUs, from their latest samples.",
            "percentunit",
            query("host:clockq_gpu_utilization_ratio:avg", "{{host}}"),
        )
        .min(0)
        .max(1),
        series(
            "GPU utilisation per GPU",
            "Each GPU's latest NVML utilisation sample.",
            "percentunit",
            query("host_gpu:clockq_gpu_utilization_ratio:max", "gpu{{gpu}}@{{host}}"),
        )
        .min(0)
        .max(1),
        series(
            "Slice switches per tier",
            "Slices that yielded their GPU to another job (checkpoint, requeue, restore), per second, by the "
            "job's own tier.",
            "ops",
            query("tier:clockq_slice_switches:rate5m", "{{tier}}"),
        ),
        series(
            "Mean switch cost per tier",
            "Checkpoint plus restore time of the slices that switched, over 5 minutes.",
            "s",
            query("tier:clockq_switch_cost_seconds:mean5m", "{{tier}}"),
        ),
        series(
            "GPU workers: live and wanted",
            "Live GPU workers per host (heartbeats), and the GPU workers the scale-out rule asks for.",
            "short",
            query("host:clockq_gpu_workers_up:count", "{{host}}"),
            query("max(clockq_desired_gpu_workers)", "wanted (all hosts)"),
        ).override_by_regexp("wanted.*", dashed()),
    ]


def load_and_admission() -> list:
    thresholds = [Threshold(value=None, color="green")] + [Threshold(value=v, color=c) for v, c in LOAD_THRESHOLDS]
    load = (
        series(
            "Load index and its forecast",
            "The latest load sample's index (demand over capacity) and the forecast 15 minutes ahead. Lines: "
            "prefetch under 30%, scale out over 70%, admission closed over 85%.",
            "percentunit",
            query("clockq:load_index:max", "load index"),
            query("clockq:load_forecast:max", "forecast (15 min ahead)"),
        )
        .thresholds(ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(thresholds))
        .thresholds_style(common.GraphThresholdsStyleConfig().mode("dashed"))
        .min(0)
    )
    states = ValueMap(
        {
            "0": ValueMappingResult(text="off", color="red", index=0),
            "1": ValueMappingResult(text="on", color="green", index=1),
        }
    )
    control = with_queries(
        statetimeline.Panel()
        .title("Admission and control state")
        .description("Admission open (new non-RT jobs queued) or closed (held); prefetch; an operator's override.")
        .datasource(DATASOURCE)
        .span(12)
        .height(6)
        .mappings([states])
        .show_value("never"),
        query("clockq:admission_open:max", "admission open"),
        query("max(clockq_prefetch_on)", "prefetch on"),
        query("max(clockq_control_forced)", "forced by an operator"),
    )
    age = with_queries(
        stat.Panel()
        .title("Forecast age")
        .description("Since the latest forecast. Over 5 minutes for 5 minutes: ClockqForecastStale.")
        .datasource(DATASOURCE)
        .unit("s")
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .span(6)
        .height(6)
        .thresholds(
            ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="green"), Threshold(value=300, color="red")])
        ),
        query("clockq:load_forecast_age_seconds:min", "age"),
    )
    disk = with_queries(
        stat.Panel()
        .title("Checkpoint disk free")
        .description(
            "Room left on the checkpoint storage, as the web role sees it. Under 10%: ClockqCheckpointDiskNearlyFull."
        )
        .datasource(DATASOURCE)
        .unit("percentunit")
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
        .span(6)
        .height(6)
        .thresholds(
            ThresholdsConfig()
            .mode(ThresholdsMode.ABSOLUTE)
            .steps([Threshold(value=None, color="red"), Threshold(value=0.10, color="green")])
        ),
        query("clockq:checkpoint_disk_free:ratio", "free"),
    )
    return [load, control, age, disk]


def build() -> Dashboard:
    board = (
        Dashboard("clockq")
        .uid("clockq-overview")
        .description("clockq's queues and service levels, GPUs and slices, load forecast and admission.")
        .tags(["clockq", "generated"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
    )
    ids = iter(range(1, 100))
    for title, panels in (
        ("Queues and service levels", queues_and_service_levels()),
        ("GPUs and slices", gpus_and_slices()),
        ("Load, forecast and admission", load_and_admission()),
    ):
        board = board.with_row(Row(title).id(next(ids)))
        for panel in panels:
            board = board.with_panel(panel.id(next(ids)))
    return board


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


if __name__ == "__main__":
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}", file=sys.stderr)
