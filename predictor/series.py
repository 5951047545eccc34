"""Load series: reading a CSV, evaluating column expressions safely, and cutting windows.

Pure numpy and the standard library. This module never imports TensorFlow (a test checks it),
so the web process and the evaluation's bookkeeping can use it freely.

The forecasting problem, in the shapes the model of issue 11 takes:

- **features**: 3 series (CPU, GPU, memory in the specification; any column expressions here).
  Fewer than 3 are padded by repeating them in order: [a] -> [a, a, a], [a, b] -> [a, b, a].
- **window**: the last `WINDOW` (10) samples of the 3 features, shape (10, 3).
- **target**: a load fraction (0..1, above 1 when demand exceeds capacity), `steps` samples
  after the window's last sample, where steps = horizon / interval (15 min at 60 s: 15 steps).
- **now**: the target's own value at the window's last sample. Persistence forecasts it, and
  the learned models forecast the change from it (see `predictor.forecasters`).
"""

from __future__ import annotations

import ast
import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WINDOW = 10  # samples per model input (the specification's network: Input(shape=(10, 3)))
FEATURES = 3  # features per sample


class SeriesError(ValueError):
    """A series, an expression or a window setting that cannot be used; the message says which."""


# --- reading ---------------------------------------------------------------------------------


@dataclass
class Table:
    """A CSV file as text columns, with the file line of every row, so that a bad value found
    later (only once an expression uses its column) can be reported by its line."""

    path: str
    columns: list[str]
    cells: dict[str, list[str]]
    lines: list[int]  # file line number of each data row (the header is line 1)

    def __len__(self) -> int:
        return len(self.lines)

    def column(self, name: str) -> np.ndarray:
        """A column as float64. An empty, non-numeric, NaN or infinite cell is refused with its
        line: there is no fill rule, because a guessed value would be scored as if observed."""
        if name not in self.cells:
            raise SeriesError(f"unknown column {name!r} in {self.path} (columns: {', '.join(self.columns)})")
        values = np.empty(len(self.lines), dtype=np.float64)
        for i, text in enumerate(self.cells[name]):
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise SeriesError(
                    f"column {name!r} has a missing or non-numeric value {text!r} "
                    f"at line {self.lines[i]} of {self.path}"
                )
            values[i] = value
        return values


def read_csv(path: str | Path) -> Table:
    """Read a CSV file with a header row. Values stay text until an expression needs them, so a
    text column (a timestamp) that no expression uses does no harm."""
    path = str(path)
    try:
        handle = open(path, newline="", encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise SeriesError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise SeriesError(f"{path} is empty (no header row)") from None
        except (csv.Error, UnicodeDecodeError) as exc:
            raise SeriesError(f"{path} is not a readable CSV file: {exc}") from exc
        columns = [name.strip() for name in header]
        if len(set(columns)) != len(columns):
            raise SeriesError(f"{path} has duplicate column names in its header")
        cells: dict[str, list[str]] = {name: [] for name in columns}
        lines: list[int] = []
        try:
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue  # blank line
                if len(row) != len(columns):
                    raise SeriesError(
                        f"line {reader.line_num} of {path} has {len(row)} fields, the header has {len(columns)}"
                    )
                for name, cell in zip(columns, row, strict=True):
                    cells[name].append(cell.strip())
                lines.append(reader.line_num)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise SeriesError(f"{path} is not a readable CSV file near line {reader.line_num}: {exc}") from exc
    return Table(path=path, columns=columns, cells=cells, lines=lines)


# --- expressions -----------------------------------------------------------------------------

_BINARY: dict[type, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    ast.Add: np.add,
    ast.Sub: np.subtract,
    ast.Mult: np.multiply,
    ast.Div: np.divide,
}


@dataclass(frozen=True)
class Expression:
    """A checked arithmetic expression over columns: numbers, column names, + - * /, unary
    minus (and plus) and parentheses. Nothing else is accepted, so an expression can name no
    function, attribute, subscript or builtin: it is parsed with `ast` and walked by hand,
    never passed to eval()."""

    text: str
    tree: ast.expr
    columns: tuple[str, ...]

    def evaluate(self, table: Table) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            values = np.broadcast_to(self._eval(self.tree, table), (len(table),)).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise SeriesError(
                f"expression {self.text!r} is not a finite number at line {table.lines[bad[0]]} of {table.path}"
                " (a division by zero?)"
            )
        return values

    def _eval(self, node: ast.expr, table: Table) -> np.ndarray:
        if isinstance(node, ast.Constant):
            assert isinstance(node.value, int | float)  # parse_expression checked it
            return np.asarray(float(node.value))
        if isinstance(node, ast.Name):
            return table.column(node.id)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, table)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._eval(node.left, table), self._eval(node.right, table))
        raise AssertionError(f"unchecked node {type(node).__name__}")  # parse_expression refused it


def parse_expression(text: str) -> Expression:
    """Parse and check `text`; a SeriesError names the expression and what is not allowed."""
    if not isinstance(text, str) or not text.strip():
        raise SeriesError("an expression is empty")
    if len(text) > 500:
        raise SeriesError(f"expression {text[:40]!r}... is too long (500 characters at most)")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise SeriesError(f"expression {text!r} is not valid arithmetic: {exc.msg}") from None
    columns: list[str] = []

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Constant):
            # bool is an int subclass: `True` is not a number a user meant to write.
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise SeriesError(f"expression {text!r}: {node.value!r} is not a number")
            return
        if isinstance(node, ast.Name):
            if node.id not in columns:
                columns.append(node.id)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            check(node.operand)
            return
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            check(node.left)
            check(node.right)
            return
        what = type(getattr(node, "op", node)).__name__
        raise SeriesError(
            f"expression {text!r} uses {what}, which is not allowed "
            "(only numbers, column names, + - * /, unary minus and parentheses)"
        )

    check(tree.body)
    return Expression(text=text.strip(), tree=tree.body, columns=tuple(columns))


def evaluate(table: Table, text: str) -> np.ndarray:
    """Parse `text` and evaluate it over `table`, checking every column it names first."""
    expression = parse_expression(text)
    for name in expression.columns:
        if name not in table.cells:
            raise SeriesError(
                f"expression {text!r} names unknown column {name!r} (columns: {', '.join(table.columns)})"
            )
    return expression.evaluate(table)


# --- durations and horizons ------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """'60s', '15m', '1h', '300' (seconds) -> seconds, strictly positive."""
    match = _DURATION.match(str(text))
    if not match:
        raise SeriesError(f"{what} {text!r} is not a duration (examples: 60s, 15m, 1h)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise SeriesError(f"{what} {text!r} must be positive")
    return seconds


def horizon_steps(interval_s: float, horizon_s: float) -> int:
    """How many samples ahead the target lies: horizon / interval, which must be a whole number
    (15 min at 60 s: 15; at 300 s: 3; at 30 s: 30)."""
    if interval_s <= 0 or horizon_s <= 0:
        raise SeriesError(f"interval ({interval_s:g} s) and horizon ({horizon_s:g} s) must be positive")
    steps = horizon_s / interval_s
    if abs(steps - round(steps)) > 1e-9 or round(steps) < 1:
        raise SeriesError(f"the horizon ({horizon_s:g} s) must be a whole multiple of the interval ({interval_s:g} s)")
    return round(steps)


# --- windows ---------------------------------------------------------------------------------


def pad_features(columns: list[np.ndarray]) -> np.ndarray:
    """Stack 1 to 3 feature series into shape (n, 3), repeating them in order when fewer than 3
    are given (the issue's rule), so the model keeps its (10, 3) input."""
    if not 1 <= len(columns) <= FEATURES:
        raise SeriesError(f"give 1 to {FEATURES} features, not {len(columns)}: the model takes {FEATURES}")
    return np.stack([columns[i % len(columns)] for i in range(FEATURES)], axis=1)


@dataclass
class Windows:
    """Model inputs and targets, in time order.

    x: (m, WINDOW, FEATURES) raw (unscaled) feature windows.
    now: (m,) the target's value at each window's last sample.
    future: (m,) the target's value `steps` samples after it (what is forecast).
    end: (m,) the row index of each window's last sample, to split in time order.
    """

    x: np.ndarray
    now: np.ndarray
    future: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.now)

    def take(self, start: int, stop: int) -> Windows:
        return Windows(self.x[start:stop], self.now[start:stop], self.future[start:stop], self.end[start:stop])


def window_count(rows: int, steps: int, window: int = WINDOW) -> int:
    """Windows a series of `rows` samples yields: each needs `window` samples of history and a
    target `steps` samples after its last one."""
    return max(0, rows - window - steps + 1)


def make_windows(features: np.ndarray, target: np.ndarray, steps: int, window: int = WINDOW) -> Windows:
    """Cut every window: window i covers rows i .. i+window-1, and its target is row
    i+window-1+steps. Memory: m * window * 3 float32s (44,640 rows: about 5 MB)."""
    rows = len(target)
    if features.shape[0] != rows:
        raise SeriesError("features and target have different lengths")
    m = window_count(rows, steps, window)
    if m == 0:
        raise SeriesError(
            f"too few rows ({rows}) for one window of {window} samples and a target {steps} samples ahead"
        )
    index = np.arange(m)[:, None] + np.arange(window)[None, :]
    end = np.arange(m) + window - 1
    x = features[index].astype(np.float32)
    return Windows(x=x, now=target[end].astype(np.float64), future=target[end + steps].astype(np.float64), end=end)


@dataclass
class Scaler:
    """Standardises each feature, and the target's change over the horizon, with statistics of
    the training part only: the validation and test parts must not leak into the model."""

    x_mean: np.ndarray  # (FEATURES,)
    x_std: np.ndarray
    y_mean: float
    y_std: float

    @classmethod
    def fit(cls, train: Windows) -> Scaler:
        flat = train.x.reshape(-1, train.x.shape[-1]).astype(np.float64)
        x_std = flat.std(axis=0)
        delta = train.future - train.now
        y_std = float(delta.std())
        # A constant feature (or a target that never changes) would divide by zero: scale by 1.
        return cls(
            x_mean=flat.mean(axis=0),
            x_std=np.where(x_std > 1e-12, x_std, 1.0),
            y_mean=float(delta.mean()),
            y_std=y_std if y_std > 1e-12 else 1.0,
        )

    def x(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.x_mean) / self.x_std).astype(np.float32)

    def delta(self, future: np.ndarray, now: np.ndarray) -> np.ndarray:
        return ((future - now - self.y_mean) / self.y_std).astype(np.float32)

    def forecast(self, scaled_delta: np.ndarray, now: np.ndarray) -> np.ndarray:
        return now + np.asarray(scaled_delta, dtype=np.float64).reshape(-1) * self.y_std + self.y_mean

    def to_dict(self) -> dict[str, object]:
        return {
            "x_mean": self.x_mean.tolist(),
            "x_std": self.x_std.tolist(),
            "y_mean": self.y_mean,
            "y_std": self.y_std,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Scaler:
        return cls(
            x_mean=np.asarray(data["x_mean"], dtype=np.float64),
            x_std=np.asarray(data["x_std"], dtype=np.float64),
            y_mean=float(data["y_mean"]),
            y_std=float(data["y_std"]),
        )
