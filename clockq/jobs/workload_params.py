"""A small declarative schema for workload params, validated on submit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ParamsError(ValueError):
    """Bad params. `errors` maps each param name to a human-readable message."""

    def __init__(self, errors: dict[str, str]):
        self.errors = errors
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))


@dataclass(frozen=True)
class Int:
    min: int
    max: int
    default: int | None = None
    help: str = ""

    def clean(self, value: Any) -> int:
        # bool is an int in Python; a JSON true is not a step count.
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise ValueError("must be a whole number")
        if not self.min <= value <= self.max:
            raise ValueError(f"must be between {self.min} and {self.max}")
        return value


@dataclass(frozen=True)
class Float:
    min: float
    max: float
    default: float | None = None
    help: str = ""

    def clean(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        value = float(value)
        if not math.isfinite(value) or not self.min <= value <= self.max:
            raise ValueError(f"must be between {self.min} and {self.max}")
        return value


@dataclass(frozen=True)
class StrList:
    max_items: int
    max_len: int
    default: list[str] | None = None
    help: str = ""

    def clean(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise ValueError("must be a non-empty list of strings")
        if len(value) > self.max_items:
            raise ValueError(f"must have at most {self.max_items} items")
        if any(len(v) > self.max_len or "\x00" in v for v in value):
            raise ValueError(f"items must be at most {self.max_len} characters, without NUL")
        return list(value)


Schema = dict[str, Int | Float | StrList]


def clean_params(schema: Schema, params: Any) -> dict[str, Any]:
    """Validate `params` against `schema`: reject unknown keys, fill defaults, check bounds."""
    if not isinstance(params, dict):
        raise ParamsError({"params": "must be a JSON object"})
    errors: dict[str, str] = {}
    cleaned: dict[str, Any] = {}
    for key in params:
        if key not in schema:
            errors[str(key)[:50]] = f"unknown param; allowed: {', '.join(sorted(schema))}"
    for key, spec in schema.items():
        if key not in params:
            if spec.default is None:
                errors[key] = "is required"
            else:
                cleaned[key] = spec.default
            continue
        try:
            cleaned[key] = spec.clean(params[key])
        except ValueError as exc:
            errors[key] = str(exc)
    if errors:
        raise ParamsError(errors)
    return cleaned
