"""The replay report: every metric's arithmetic on hand-made results, the tables, the charts."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from clockq.replay.ledger import Ledger
from clockq.replay.model import JobResult, RunResult, TraceJob
from clockq.replay.report import human_pct, human_s, markdown, plot, quantile, summarize, table, wait_s


def job(key, tier, submit, *, duration=1.0, gpus=1, deadline=None) -> TraceJob:
    return TraceJob(
        key=key,
        line=1,
        submit_s=submit,
        duration_s=duration,
        num_gpu=gpus,
        tier=tier,
        deadline_s=deadline,
        checkpoint_mb=100.0,
    )


def run_of(results, *, policy="fifo", gpus=2, busy=1000.0, switch=20.0, events=600, wall=0.5) -> RunResult:
    return RunResult(
        policy=policy,
        gpus=gpus,
        jobs=results,
        busy_gpu_s=busy,
        switch_gpu_s=switch,
        start_order=[r.job.key for r in results if r.first_start_s is not None],
        events=events,
        wall_s=wall,
    )


def sample_jobs() -> list[JobResult]:
    """Six jobs over four tiers (no BP), with known waits, JCTs and on-time verdicts."""
    return [
        # RT, 20 ms wait (target 50 ms): on time. JCT 1.02.
        JobResult(job("a", "RT", 0.0), first_start_s=0.02, finish_s=1.02),
        # RT never started: given up at 2.5 (its wait: 1.5 s). Timed out, not on time.
        JobResult(job("b", "RT", 1.0), finish_s=2.5, timed_out=True),
        # HP, 90 s wait (target 60 s), no deadline: late. JCT 190.
        JobResult(job("c", "HP", 0.0), first_start_s=90.0, finish_s=190.0, preemptions=2),
        # HP, 10 s wait: on time. JCT 20.
        JobResult(job("d", "HP", 10.0), first_start_s=20.0, finish_s=30.0),
        # SP, 700 s wait (target 600 s) but a deadline it met: on time. JCT 800.
        JobResult(job("e", "SP", 0.0, deadline=900.0), first_start_s=700.0, finish_s=800.0, promotions=1),
        # BK (no target), no wait, but past its deadline: not on time. JCT 995.
        JobResult(job("f", "BK", 5.0, deadline=500.0), first_start_s=5.0, finish_s=1000.0, preemptions=1),
    ]


@pytest.fixture
def summary():
    return summarize(run_of(sample_jobs()))


def test_quantile_takes_the_nearest_rank():
    assert quantile([], 0.95) is None
    assert quantile([7.0], 0.95) == 7.0
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([float(i) for i in range(1, 21)], 0.95) == 19.0  # ceil(0.95 x 20) = 19th
    assert quantile([float(i) for i in range(1, 101)], 0.95) == 95.0
    assert quantile([float(i) for i in range(1, 7)], 0.95) == 6.0  # ceil(5.7) = 6th: the largest
    with pytest.raises(ValueError):
        quantile([1.0], 0.0)


def test_summary_names_policy_and_gpus_and_counts_jobs(summary):
    assert summary["policy"] == "fifo"
    assert summary["gpus"] == 2
    assert summary["jobs"] == 6
    assert summary["succeeded"] == 5
    assert summary["timed_out"] == 1
    assert summary["unfinished"] == 0


def test_waits_overall_count_the_never_started_job_until_it_was_given_up(summary):
    waits = [0.02, 1.5, 90.0, 10.0, 700.0, 0.0]
    assert wait_s(sample_jobs()[1]) == 1.5
    assert summary["wait_mean_s"] == pytest.approx(sum(waits) / 6)
    assert summary["wait_p95_s"] == 700.0


def test_waits_per_tier_only_for_tiers_present_in_rank_order(summary):
    tiers = summary["tiers"]
    assert list(tiers) == ["RT", "HP", "SP", "BK"]  # no BP in the trace
    assert {code: t["jobs"] for code, t in tiers.items()} == {"RT": 2, "HP": 2, "SP": 1, "BK": 1}
    assert tiers["RT"]["wait_mean_s"] == pytest.approx(0.76)
    assert tiers["RT"]["wait_p95_s"] == 1.5
    assert tiers["HP"]["wait_mean_s"] == 50.0
    assert tiers["HP"]["wait_p95_s"] == 90.0
    assert tiers["SP"]["wait_mean_s"] == tiers["SP"]["wait_p95_s"] == 700.0
    assert tiers["BK"]["wait_mean_s"] == tiers["BK"]["wait_p95_s"] == 0.0


def test_tier_order_follows_rank_not_trace_order():
    results = [
        JobResult(job("x", "BK", 0.0), first_start_s=1.0, finish_s=2.0),
        JobResult(job("y", "RT", 0.0), first_start_s=0.0, finish_s=1.0),
    ]
    assert list(summarize(run_of(results))["tiers"]) == ["RT", "BK"]


def test_utilisation_and_switch_overhead_over_the_makespan(summary):
    assert summary["makespan_s"] == 1000.0  # last finish (f, 1000) - first submit (0)
    assert summary["gpu_utilisation"] == pytest.approx(1000.0 / (2 * 1000.0))
    assert summary["switch_overhead"] == pytest.approx(20.0 / (2 * 1000.0))
    assert summary["busy_gpu_s"] == 1000.0
    assert summary["switch_gpu_s"] == 20.0


def test_utilisation_in_the_arrival_window_and_gpu_time_idle_while_jobs_wait():
    run = run_of(sample_jobs())
    run.window_s, run.window_held_gpu_s = 10.0, 15.0  # submits from 0 to 10, 1.5 GPUs held on average
    run.waiting_s, run.held_while_waiting_gpu_s = 100.0, 150.0  # of 2 x 100 GPU-s, 50 sat idle
    s = summarize(run)
    assert s["window_utilisation"] == pytest.approx(15.0 / (2 * 10.0))
    assert s["idle_while_waiting"] == pytest.approx(50.0 / (2 * 1000.0))  # of the capacity over the makespan


def test_the_ledger_counts_gpus_held_within_the_arrival_window_and_idle_while_jobs_wait():
    ledger = Ledger(gpus=4, window_start=10.0, window_end=20.0)
    ledger.elapse(0.0, 15.0, held_gpus=2, jobs_wait=False)  # 5 s of it in the window
    ledger.elapse(15.0, 30.0, held_gpus=3, jobs_wait=True)  # 5 s in the window; 15 s of waiting
    ledger.elapse(30.0, 30.0, held_gpus=4, jobs_wait=True)  # no time
    assert ledger.window_held_gpu_s == pytest.approx(5 * 2 + 5 * 3)
    assert (ledger.waiting_s, ledger.held_while_waiting_gpu_s) == (15.0, 45.0)
    assert ledger.window_s == 10.0


def test_makespan_starts_at_the_first_submission_and_counts_a_timeout_as_an_end():
    results = [
        JobResult(job("a", "HP", 100.0), first_start_s=100.0, finish_s=150.0),
        JobResult(job("b", "RT", 140.0), finish_s=160.0, timed_out=True),
    ]
    s = summarize(run_of(results, gpus=4, busy=120.0, switch=6.0))
    assert s["makespan_s"] == 60.0
    assert s["gpu_utilisation"] == pytest.approx(120.0 / 240.0)
    assert s["switch_overhead"] == pytest.approx(6.0 / 240.0)


def test_timeout_and_on_time_rates(summary):
    assert summary["timeout_rate"] == pytest.approx(1 / 6)
    assert summary["on_time"] == 3  # a (wait target), d (wait target), e (deadline)
    assert summary["on_time_rate"] == pytest.approx(3 / 6)


@pytest.mark.parametrize(
    ("result", "on_time"),
    [
        # deadline decides when there is one, whatever the wait
        (JobResult(job("j", "SP", 0.0, deadline=50.0), first_start_s=40.0, finish_s=50.0), True),  # at the deadline
        (JobResult(job("j", "RT", 0.0, deadline=50.0), first_start_s=0.0, finish_s=50.5), False),  # past it
        (JobResult(job("j", "RT", 0.0, deadline=50.0), first_start_s=30.0, finish_s=40.0), True),  # long wait
        # without one, the first wait against the tier's target (RT 50 ms, HP 60 s)
        (JobResult(job("j", "RT", 1.0), first_start_s=1.05, finish_s=2.0), True),  # exactly the target
        (JobResult(job("j", "RT", 1.0), first_start_s=1.052, finish_s=2.0), False),
        (JobResult(job("j", "HP", 0.0), first_start_s=60.0, finish_s=500.0), True),
        (JobResult(job("j", "HP", 0.0), first_start_s=60.5, finish_s=61.0), False),
        # a tier without a target: on time whenever it succeeded
        (JobResult(job("j", "BK", 0.0), first_start_s=86_400.0, finish_s=90_000.0), True),
        # never on time when it did not succeed
        (JobResult(job("j", "BK", 0.0), finish_s=10.0, timed_out=True), False),
        (JobResult(job("j", "BK", 0.0)), False),
    ],
)
def test_on_time_by_deadline_or_by_wait_target(result, on_time):
    assert summarize(run_of([result]))["on_time"] == int(on_time)


def test_jct_over_succeeded_jobs_only(summary):
    jcts = [1.02, 190.0, 20.0, 800.0, 995.0]  # not b, which timed out
    assert summary["jct_mean_s"] == pytest.approx(sum(jcts) / 5)
    assert summary["jct_p95_s"] == 995.0


def test_preemption_promotion_and_event_totals(summary):
    assert summary["preemptions"] == 3
    assert summary["promotions"] == 1
    assert summary["events"] == 600
    assert summary["wall_s"] == 0.5
    assert summary["events_per_s"] == pytest.approx(1200.0)


def test_a_job_that_neither_started_nor_ended_has_no_wait():
    results = [
        JobResult(job("a", "HP", 0.0), first_start_s=4.0, finish_s=10.0),
        JobResult(job("b", "HP", 2.0)),
    ]
    s = summarize(run_of(results))
    assert s["unfinished"] == 1
    assert s["wait_mean_s"] == s["wait_p95_s"] == 4.0
    assert s["tiers"]["HP"]["jobs"] == 2
    assert s["makespan_s"] == 10.0
    assert s["on_time_rate"] == pytest.approx(1 / 2)


def test_nothing_to_divide_by_is_none_and_the_summary_is_json():
    s = summarize(run_of([], wall=0.0, busy=0.0, switch=0.0))
    for key in ("wait_mean_s", "wait_p95_s", "gpu_utilisation", "switch_overhead", "timeout_rate"):
        assert s[key] is None
    assert s["events_per_s"] is None and s["makespan_s"] is None and s["tiers"] == {}
    json.dumps(summarize(run_of(sample_jobs())), allow_nan=False)
    json.dumps(s, allow_nan=False)


def test_an_unknown_tier_is_an_error():
    with pytest.raises(ValueError, match="XX"):
        summarize(run_of([JobResult(job("a", "XX", 0.0), first_start_s=0.0, finish_s=1.0)]))


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0.0, "0 s"),
        (0.00042, "0.42 ms"),
        (0.85, "850 ms"),
        (3.25, "3.2 s"),
        (12.0, "12 s"),
        (228.0, "3.8 min"),
        (7560.0, "2.1 h"),
        (36 * 3600.0, "36.0 h"),
        (4.5 * 86_400, "4.5 d"),
    ],
)
def test_human_durations(seconds, text):
    assert human_s(seconds) == text


def test_human_percentages():
    assert human_pct(None) == "-"
    assert human_pct(0.5) == "50.0%"
    assert human_pct(0.0004) == "0.04%"
    assert human_pct(0.0) == "0.0%"


def summaries():
    """fifo on the sample; clockq with every job that started starting (and ending) 60 s later."""
    later = [
        replace(r, first_start_s=r.first_start_s + 60, finish_s=r.finish_s + 60) if r.first_start_s is not None else r
        for r in sample_jobs()
    ]
    return [summarize(run_of(sample_jobs(), policy="fifo")), summarize(run_of(later, policy="clockq"))]


def test_table_has_a_column_per_policy_and_a_row_per_metric():
    text = table(summaries())
    header, rule, *rows = text.splitlines()
    assert header.split() == ["metric", "fifo", "clockq"]
    assert set(rule) <= {"-", " "}
    cells = {row.split("  ")[0].strip(): re.split(r"\s{2,}", row.strip())[1:] for row in rows}
    for label in (
        "jobs",
        "mean wait",
        "p95 wait",
        "RT mean wait",
        "RT p95 wait",
        "BK p95 wait",
        "GPU utilisation",
        "switch overhead",
        "timeout rate",
        "on-time rate",
        "mean JCT",
        "p95 JCT",
        "makespan",
        "preemptions",
        "promotions",
    ):
        assert len(cells[label]) == 2, label
    assert not any(label.startswith("BP") for label in cells)
    assert cells["p95 wait"] == ["11.7 min", "12.7 min"]  # 700 s; 760 s when every start is 60 s later
    assert cells["RT mean wait"] == ["760 ms", "31 s"]  # (0.02 + 1.5) / 2; (60.02 + 1.5) / 2
    assert cells["GPU utilisation"] == ["50.0%", "47.2%"]  # 1000 / (2 x 1000); 1000 / (2 x 1060)
    assert cells["switch overhead"] == ["1.0%", "0.9%"]
    assert cells["timeout rate"] == ["16.7%", "16.7%"]
    assert cells["on-time rate"] == ["50.0%", "16.7%"]  # later, only e (by its deadline) is on time
    assert cells["RT jobs"] == ["2", "2"]
    assert cells["makespan"] == ["16.7 min", "17.7 min"]
    assert cells["p95 JCT"] == ["16.6 min", "17.6 min"]
    assert cells["preemptions"] == ["3", "3"]


def test_table_names_the_gpus_when_the_policies_ran_on_different_counts():
    a = summarize(run_of(sample_jobs(), policy="las", gpus=2))
    b = summarize(run_of(sample_jobs(), policy="las", gpus=8))
    assert "las (2 GPUs)" in table([a, b]) and "las (8 GPUs)" in markdown([a, b])


def test_markdown_has_the_same_rows_and_a_column_per_policy():
    text = markdown(summaries())
    header, rule, *rows = text.splitlines()
    assert header == "| metric | fifo | clockq |"
    assert rule == "| --- | ---: | ---: |"
    assert len(rows) == len(table(summaries()).splitlines()) - 2
    assert all(row.startswith("| ") and row.endswith(" |") and row.count(" | ") == 2 for row in rows)
    assert "| GPU utilisation | 50.0% | 47.2% |" in rows


def test_tables_need_a_summary():
    with pytest.raises(ValueError):
        table([])


def runs():
    return [run_of(sample_jobs(), policy="fifo"), run_of(sample_jobs(), policy="clockq")]


def test_plot_writes_html_with_plotly_inlined(tmp_path):
    path = tmp_path / "waits.html"
    plot(runs(), str(path))
    html = path.read_text()
    assert "<html>" in html[:100] and html.rstrip().endswith("</html>")
    assert "<script src=" not in html  # plotly.js inlined: no CDN, works offline
    assert "fifo" in html and "clockq" in html and "RT (real-time inference)" in html


def test_plot_writes_png(tmp_path):
    path = tmp_path / "waits.png"
    plot(runs(), str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1000


@pytest.mark.parametrize("name", ["waits.pdf", "waits", "waits.svg"])
def test_plot_refuses_other_formats(tmp_path, name):
    with pytest.raises(ValueError, match="html"):
        plot(runs(), str(tmp_path / name))
    assert not (tmp_path / name).exists()
