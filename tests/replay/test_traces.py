"""Trace loading: the real Alibaba and Tiresias files map as documented; bad input is refused
with its line and column. Small CSVs written here are generated test data, not real traces."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from clockq.replay import traces
from clockq.replay.model import TraceError
from clockq.replay.traces import check_fits, load

# Excerpts of the real traces, committed as fixtures (sources in fixtures/README.md), so that
# these tests run wherever the repository is cloned; the whole files are checked too where
# ../shared/data is present.
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ALIBABA = str(FIXTURES / "alibaba_openb2023_first_1000.csv")
TIRESIAS = str(FIXTURES / "tiresias_first_40.csv")
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "jobs"

CSV_HEADER = "submit_time,duration,num_gpu,tier,deadline"
ALIBABA_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def write(tmp_path: Path, *lines: str, name: str = "generated.csv") -> str:
    """A generated trace file."""
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def refused(path: str, fmt: str, line: int | None, column: str | None, **kwargs) -> str:
    with pytest.raises(TraceError) as caught:
        load(path, fmt, **kwargs)
    error = caught.value
    assert (error.line, error.column) == (line, column), str(error)
    message = str(error)
    assert message.startswith(path)
    if line is not None:
        assert f"line {line}" in message
    if column is not None:
        assert repr(column) in message
    return message


# --- the real files ---


def test_alibaba_tiers_and_skipped_rows():
    # The counts were made apart from the loader, with csv.DictReader and the mapping's rules.
    trace = load(ALIBABA, "alibaba")
    assert trace.name == "alibaba_openb2023_first_1000.csv"
    assert Counter(j.tier for j in trace.jobs) == {"HP": 272, "BP": 236, "BK": 215, "RT": 69, "SP": 13}
    assert trace.skipped == {traces.SKIP_NO_GPU: 116, traces.SKIP_NEVER_STARTED: 79}
    assert len(trace.jobs) + sum(trace.skipped.values()) == 1000  # every row accounted for
    assert Counter(j.num_gpu for j in trace.jobs) == {1: 800, 8: 4, 2: 1}
    assert any("does not pack fractions" in line for line in trace.mapping)
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)
    # openb-pod-0001: LS, gpu_milli 460, created and scheduled at 427061, deleted at 12902960.
    pod = trace.jobs[1]
    assert (pod.key, pod.line, pod.tier, pod.num_gpu) == ("openb-pod-0001", 3, "RT", 1)
    assert pod.avg_util == pytest.approx(0.46)
    assert pod.duration_s == 12902960 - 427061
    assert pod.deadline_s == pytest.approx(427061 + 0.05 + 2 * (12902960 - 427061))
    assert pod.checkpoint_mb == 100.0
    assert all(j.deadline_s is None for j in trace.jobs if j.tier == "BK")


@pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not next to this clone")
def test_the_whole_shared_traces_map_as_the_readme_says():
    alibaba = load(str(DATA / "alibaba_openb2023_pods.csv"), "alibaba")
    assert Counter(j.tier for j in alibaba.jobs) == {"HP": 3006, "BK": 1983, "RT": 590, "BP": 527, "SP": 97}
    assert alibaba.skipped == {traces.SKIP_NO_GPU: 1088, traces.SKIP_NEVER_STARTED: 861}
    assert Counter(j.num_gpu for j in alibaba.jobs) == {1: 6129, 8: 44, 2: 15, 4: 15}
    tiresias = load(str(DATA / "tiresias_60_jobs.csv"), "tiresias")
    assert Counter(j.tier for j in tiresias.jobs) == {"HP": 49, "SP": 11}


def test_tiresias_tiers_and_checkpoint_sizes():
    trace = load(TIRESIAS, "tiresias")
    assert len(trace.jobs) == 40 and trace.skipped == {}
    assert Counter(j.tier for j in trace.jobs) == {"HP": 33, "SP": 7}
    first = trace.jobs[0]  # job 0: 1 GPU, vgg19, 164 s at 0 s
    assert (first.key, first.num_gpu, first.tier, first.avg_util) == ("0", 1, "HP", None)
    assert first.checkpoint_mb == pytest.approx(1149.6)
    assert first.deadline_s == pytest.approx(0 + 60 + 2 * 164)
    sizes = {}
    for row, job in zip(Path(TIRESIAS).read_text().splitlines()[1:], trace.jobs, strict=True):
        sizes[row.split(",")[4]] = job.checkpoint_mb
    assert sizes == pytest.approx(
        {
            "vgg19": 1149.6,
            "vgg16": 1107.2,
            "vgg11": 1063.2,
            "alexnet": 488.8,
            "resnet50": 204.8,
            "resnet101": 356.0,
            "resnet152": 481.6,
            "inception3": 217.6,
            "inception4": 341.6,
            "googlenet": 52.8,
        }
    )


def test_tiresias_scaling_until_and_gpu_time_tiers():
    plain = load(TIRESIAS, "tiresias")
    scaled = load(TIRESIAS, "tiresias", arrival_scale=10, duration_scale=2, until_s=50)
    kept = [j for j in plain.jobs if j.submit_s / 10 < 50]
    assert 0 < len(scaled.jobs) == len(kept) < 40
    for before, after in zip(kept, scaled.jobs, strict=False):
        assert after.submit_s == pytest.approx(before.submit_s / 10)
        assert after.duration_s == pytest.approx(before.duration_s / 2)
        assert after.tier == before.tier  # tiers come from the trace's own gpu_time, not the scaled one
        wait_s = {"HP": 60, "SP": 600}[after.tier]
        assert after.deadline_s == pytest.approx(after.submit_s + wait_s + 2 * after.duration_s)
    assert any("before 50 s" in line for line in scaled.mapping)


def test_check_fits_names_the_first_job_too_large():
    trace = load(TIRESIAS, "tiresias")
    check_fits(trace, 8, TIRESIAS)
    with pytest.raises(TraceError) as caught:
        check_fits(trace, 4, TIRESIAS)
    assert (caught.value.line, caught.value.column) == (3, "num_gpu")  # job 1 asks for 8 GPUs
    with pytest.raises(ValueError, match="gpus"):
        check_fits(trace, 0, TIRESIAS)


# --- deadlines and keys, on generated files ---


def test_csv_deadlines_derived_and_given(tmp_path):
    path = write(
        tmp_path,
        "job_id," + CSV_HEADER + ",checkpoint_mb",
        "a,10,4,1,rt,,",  # derived: 10 + 0.05 + 2*4/2
        "b,10,4,2,BK,,7",  # best effort: no deadline
        "c,20,4,1,SP,50,",  # given: 30 s after submit, halved with the durations
        "d,20,4,1,HP,20,",  # a deadline at the submit time itself is allowed
    )
    trace = load(path, "csv", arrival_scale=2, duration_scale=2, slack=2, checkpoint_mb=3)
    a, b, c, d = trace.jobs
    assert (a.submit_s, a.duration_s, a.tier) == (5, 2, "RT")
    assert a.deadline_s == pytest.approx(5 + 0.05 + 2 * 2)
    assert (b.deadline_s, b.checkpoint_mb, a.checkpoint_mb) == (None, 7, 3)
    assert c.deadline_s == pytest.approx(10 + 30 / 2)
    assert d.deadline_s == 10


def test_csv_keys_fall_back_to_name_then_line(tmp_path):
    named = write(tmp_path, "name," + CSV_HEADER, "x,0,1,1,HP,", name="named.csv")
    assert load(named, "csv").jobs[0].key == "x"
    unnamed = write(tmp_path, CSV_HEADER, "0,1,1,HP,", "0,1,1,HP,", name="unnamed.csv")
    assert [j.key for j in load(unnamed, "csv").jobs] == ["2", "3"]


def test_alibaba_skips_rows_that_are_no_gpu_job(tmp_path):
    path = write(
        tmp_path,
        ALIBABA_HEADER,
        "p0,1,1,0,0,,LS,Running,0,100,0",  # no GPU
        "p1,1,1,1,1000,,BE,Pending,1,100,",  # never scheduled
        "p2,1,1,1,1000,,BE,Failed,2,5,5",  # deleted as it was scheduled
        "p3,1,1,2,1000,,BE,Running,3,100,10",
        "p4,1,1,1,250,,BE,Running,4,100,10",
        "p5,1,1,1,500,,Guaranteed,Running,5,100,10",
        "p6,1,1,1,1000,,Burstable,Running,6,100,10",
    )
    trace = load(path, "alibaba", checkpoint_mb=42)
    assert [(j.key, j.tier, j.num_gpu) for j in trace.jobs] == [
        ("p3", "BP", 2),
        ("p4", "BK", 1),
        ("p5", "HP", 1),
        ("p6", "SP", 1),
    ]
    assert trace.skipped == {traces.SKIP_NO_GPU: 1, traces.SKIP_NEVER_STARTED: 1, traces.SKIP_NO_RUN_TIME: 1}
    assert trace.jobs[0].duration_s == 90 and trace.jobs[1].avg_util == 0.25
    assert {j.checkpoint_mb for j in trace.jobs} == {42}


def test_tiresias_unknown_model_gets_the_default_size(tmp_path):
    path = write(
        tmp_path,
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval",
        "0,1,0,10,bert,100,1",
        "1,4,1,10,VGG19,7201,1",  # 28804 GPU-s: over 8 GPU-hours
    )
    trace = load(path, "tiresias", checkpoint_mb=5)
    assert [(j.checkpoint_mb, j.tier) for j in trace.jobs] == [(5, "HP"), (pytest.approx(1149.6), "BP")]
    assert any("'bert'" in line for line in trace.mapping)


# --- refusals ---


def test_unreadable_files_are_refused(tmp_path):
    refused(str(tmp_path / "missing.csv"), "csv", None, None)
    refused(str(tmp_path), "csv", None, None)  # a folder
    assert "empty" in refused(write(tmp_path, "", name="empty.csv"), "csv", None, None)
    assert "no rows" in refused(write(tmp_path, CSV_HEADER, name="header.csv"), "csv", None, None)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"submit_time,duration,num_gpu,tier\n\xff\xfe\x00\x01\n")
    assert "UTF-8" in refused(str(binary), "csv", None, None)  # decoding reads ahead: no honest line
    refused(write(tmp_path, CSV_HEADER, "0,1,1,HP,", name="ok.csv"), "parquet", None, None)


def test_missing_columns_name_the_column(tmp_path):
    refused(write(tmp_path, "submit_time,num_gpu,tier", "0,1,HP"), "csv", 1, "duration")
    head = ALIBABA_HEADER.replace(",qos,", ",class,")
    refused(write(tmp_path, head, "p,1,1,1,1000,,LS,Running,0,9,0", name="a.csv"), "alibaba", 1, "qos")
    refused(write(tmp_path, "job_id,num_gpu,submit_time", "0,1,0", name="t.csv"), "tiresias", 1, "model_name")


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("x,1,1,HP,", "submit_time"),
        (",1,1,HP,", "submit_time"),
        ("nan,1,1,HP,", "submit_time"),
        ("-1,1,1,HP,", "submit_time"),
        ("0,inf,1,HP,", "duration"),
        ("0,-5,1,HP,", "duration"),
        ("0,0,1,HP,", "duration"),
        ("0,1,0,HP,", "num_gpu"),
        ("0,1,1.5,HP,", "num_gpu"),
        ("0,1,-2,HP,", "num_gpu"),
        ("0,1,1,XX,", "tier"),
        ("5,1,1,HP,4", "deadline"),
        ("0,1,1,HP,soon", "deadline"),
    ],
)
def test_bad_values_are_refused_with_line_and_column(tmp_path, row, column):
    path = write(tmp_path, CSV_HEADER, "0,1,1,HP,", row)
    refused(path, "csv", 3, column)


def test_rows_out_of_submit_order_are_refused(tmp_path):
    path = write(tmp_path, CSV_HEADER, "0,1,1,HP,", "10,1,1,HP,", "10,1,1,HP,", "9,1,1,HP,")
    assert "submit order" in refused(path, "csv", 5, "submit_time")


def test_row_shape_and_duplicate_keys_are_refused(tmp_path):
    refused(write(tmp_path, CSV_HEADER, "0,1,1,HP", name="short.csv"), "csv", 2, None)
    refused(write(tmp_path, CSV_HEADER, "0,1,1,HP,,9", name="long.csv"), "csv", 2, None)
    dup = write(tmp_path, "job_id," + CSV_HEADER, "a,0,1,1,HP,", "a,1,1,1,HP,", name="dup.csv")
    assert "line 2" in refused(dup, "csv", 3, None)


def test_alibaba_bad_values_are_refused(tmp_path):
    def pod(qos: str = "LS", num_gpu: str = "1", milli: str = "1000") -> str:
        return write(tmp_path, ALIBABA_HEADER, f"p,1,1,{num_gpu},{milli},,{qos},Running,0,9,0")

    refused(pod(qos="Premium"), "alibaba", 2, "qos")
    refused(pod(num_gpu="-1"), "alibaba", 2, "num_gpu")
    refused(pod(milli="0"), "alibaba", 2, "gpu_milli")


def test_too_many_rows_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "MAX_ROWS", 2)
    path = write(tmp_path, CSV_HEADER, "0,1,1,HP,", "0,1,1,HP,", "0,1,1,HP,")
    refused(path, "csv", 4, None)


def test_no_job_left_is_refused(tmp_path):
    path = write(tmp_path, CSV_HEADER, "10,1,1,HP,")
    assert "until_s" in refused(path, "csv", None, None, until_s=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"arrival_scale": 0},
        {"arrival_scale": float("nan")},
        {"duration_scale": -1},
        {"slack": -0.1},
        {"checkpoint_mb": -1},
        {"until_s": 0},
    ],
)
def test_bad_arguments_raise_value_error(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name) as caught:
        load(TIRESIAS, "tiresias", **kwargs)
    assert not isinstance(caught.value, TraceError)


def test_tiers_missing_for_the_mapping_raise_value_error():
    from clockq.policy.tiers import TIERS

    with pytest.raises(ValueError, match="BP"):
        load(TIRESIAS, "tiresias", tiers=[t for t in TIERS if t.code != "BP"])
