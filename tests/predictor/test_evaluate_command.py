"""manage.py evaluate_predictor: its JSON shape on a generated series, and clear errors."""

import json
from io import StringIO

import numpy as np
import pytest
from django.core.management import CommandError, call_command


@pytest.fixture
def generated_csv(tmp_path):
    """Generated data (not a real trace): GPU counts of a 64-GPU cluster, as a noisy sine, in the
    Helios file's column names."""
    rng = np.random.default_rng(5)
    n = 420
    running = np.clip(np.round(40 + 20 * np.sin(np.arange(n) / 15) + rng.normal(0, 2, n)), 0, 64)
    pending = np.clip(np.round(rng.normal(4, 3, n)), 0, None)
    path = tmp_path / "generated_gpu.csv"
    lines = ["time,running_gpu_num,pending_gpu_num,total_gpu_num,cpu_util_percent"]
    lines += [
        f"t{i},{int(r)},{int(p)},64,{50 + 10 * np.sin(i / 15):.3f}"
        for i, (r, p) in enumerate(zip(running, pending, strict=True))
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args):
    out = StringIO()
    call_command("evaluate_predictor", *map(str, args), stdout=out)
    return out.getvalue()


def test_json_shape(generated_csv):
    out = run(
        generated_csv, "--features", "running_gpu_num/total_gpu_num", "cpu_util_percent/100",
        "--target", "(running_gpu_num+pending_gpu_num)/total_gpu_num",
        "--interval", "60s", "--horizon", "5m", "--seed", "1", "--max-epochs", "2", "--json",
    )  # fmt: skip
    report = json.loads(out)
    for name in ("lstm", "persistence", "linear", "champion"):
        assert {"mae", "rmse", "bucket_accuracy"} <= set(report[name]), name
        assert report[name]["mae"] >= 0 and 0 <= report[name]["bucket_accuracy"] <= 1
    assert report["champion"]["model"] in ("lstm", "persistence", "linear")
    assert report["champion"]["validation"]["mae"] <= report["persistence"]["validation"]["mae"]
    assert report["split"]["steps"] == 5 and report["split"]["train"] > report["split"]["test"] > 0
    assert report["lstm"]["epochs"] <= 2 and report["lstm"]["latency_ms"]["median"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--features", "runing_gpu_num", "--target", "cpu_util_percent/100"], "unknown column 'runing_gpu_num'"),
        (["--features", "__import__('os')", "--target", "cpu_util_percent/100"], "not allowed"),
        (["--features", "time", "--target", "cpu_util_percent/100"], "column 'time'"),
        (["--features", "running_gpu_num", "--target", "cpu_util_percent/100", "--interval", "0s"], "positive"),
        (["--features", "running_gpu_num", "--target", "cpu_util_percent/100", "--horizon", "100s"], "whole multiple"),
        (["--features", "running_gpu_num", "--target", "cpu_util_percent/100", "--horizon", "6h"], "too few rows"),
        (["--features", "a", "b", "c", "d", "--target", "a"], "1 to 3 features"),
    ],
)
def test_bad_input_is_a_command_error(generated_csv, args, message):
    if "--interval" not in args:
        args = [*args, "--interval", "60s"]
    with pytest.raises(CommandError, match=message):
        run(generated_csv, *args)


def test_missing_file(tmp_path):
    with pytest.raises(CommandError, match="cannot read"):
        run(tmp_path / "absent.csv", "--features", "a", "--target", "a", "--interval", "60s")
