"""The column-expression evaluator: arithmetic over columns, and nothing else."""

import numpy as np
import pytest

from predictor.series import SeriesError, evaluate, parse_expression, read_csv


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "load.csv"
    path.write_text("time,running,pending,total,cpu_pct\nt0,2,1,4,50\nt1,3,0,4,25\nt2,4,4,4,100\n")
    return read_csv(path)


def test_column_names_and_arithmetic(table):
    assert evaluate(table, "running").tolist() == [2, 3, 4]
    assert evaluate(table, "(running+pending)/total").tolist() == [0.75, 0.75, 2.0]
    assert evaluate(table, "cpu_pct/100").tolist() == [0.5, 0.25, 1.0]
    assert evaluate(table, "-running * 2 - -1").tolist() == [-3, -5, -7]
    assert evaluate(table, "0.5").tolist() == [0.5, 0.5, 0.5]  # a constant is broadcast
    assert parse_expression(" (running + pending) / total ").columns == ("running", "pending", "total")


@pytest.mark.parametrize(
    "hostile",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "running.__class__",
        "total.real",
        "abs(running)",
        "running[0]",
        "running ** 2",
        "running // 2",
        "running % 2",
        "lambda: 1",
        "[running]",
        "running if total else pending",
        "running < total",
        "'text'",
        "True",
        "running; pending",
        "x := 1",
    ],
)
def test_hostile_or_unsupported_expressions_are_refused(table, hostile):
    with pytest.raises(SeriesError) as caught:
        evaluate(table, hostile)
    assert hostile.strip() in str(caught.value) or "not valid arithmetic" in str(caught.value)


def test_unknown_column_is_named(table):
    with pytest.raises(SeriesError, match=r"unknown column 'runing'"):
        evaluate(table, "runing/total")


def test_text_column_is_refused_with_its_line(table):
    with pytest.raises(SeriesError, match=r"column 'time' .* 't0' at line 2"):
        evaluate(table, "time")


def test_missing_value_is_refused_with_its_line(tmp_path):
    path = tmp_path / "gap.csv"
    path.write_text("a,b\n1,2\n3,\n5,nan\n")
    table = read_csv(path)
    assert evaluate(table, "a").tolist() == [1, 3, 5]  # an unused column's gap does no harm
    with pytest.raises(SeriesError, match=r"column 'b' .* at line 3"):
        evaluate(table, "a+b")


def test_division_by_zero_names_the_expression_and_line(tmp_path):
    path = tmp_path / "zero.csv"
    path.write_text("running,total\n1,2\n1,0\n")
    with pytest.raises(SeriesError, match=r"'running/total' is not a finite number at line 3"):
        evaluate(read_csv(path), "running/total")


def test_bad_files(tmp_path):
    with pytest.raises(SeriesError, match="cannot read"):
        read_csv(tmp_path / "absent.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(SeriesError, match="empty"):
        read_csv(empty)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b\n1,2\n3\n")
    with pytest.raises(SeriesError, match="line 3"):
        read_csv(ragged)


def test_results_are_float_arrays(table):
    values = evaluate(table, "running")
    assert values.dtype == np.float64 and values.shape == (3,)
