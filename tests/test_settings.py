"""Settings from the environment: good values parse, bad ones fail loudly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from clockq.env import env_bool, env_float, env_int, parse_gpus
from tests.harness import ROOT


@pytest.mark.parametrize(
    ("raw", "parsed"), [("auto", "auto"), ("AUTO", "auto"), ("sim:3", "sim:3"), ("0,1,3", [0, 1, 3]), (" 2 ", [2])]
)
def test_gpus_setting_parses(raw, parsed):
    assert parse_gpus(raw) == parsed


@pytest.mark.parametrize("raw", ["sim:0", "sim:x", "sim:999", "0,0", "-1", "gpu0", "", "0,,1"])
def test_bad_gpus_setting_is_refused(raw):
    with pytest.raises(ImproperlyConfigured, match="CLOCKQ_GPUS"):
        parse_gpus(raw)


def test_env_helpers_refuse_bad_values(monkeypatch):
    monkeypatch.setenv("X", "maybe")
    with pytest.raises(ImproperlyConfigured, match="not a boolean"):
        env_bool("X", False)
    monkeypatch.setenv("X", "12abc")
    with pytest.raises(ImproperlyConfigured, match="not an integer"):
        env_int("X", 1)
    monkeypatch.setenv("X", "70000")
    with pytest.raises(ImproperlyConfigured, match="above the maximum"):
        env_int("X", 1, max_value=65535)
    monkeypatch.setenv("X", "nan")
    with pytest.raises(ImproperlyConfigured, match="outside"):
        env_float("X", 1.0, min_value=0, max_value=10)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PORT", "http", "PORT='http' is not an integer"),
        ("DEBUG", "sometimes", "DEBUG='sometimes' is not a boolean"),
        ("DATABASE_URL", "mysql://x/y", "only sqlite and postgresql"),
        ("DATABASE_URL", "nonsense", "DATABASE_URL"),
        ("REDIS_URL", "http://localhost", "REDIS_URL"),
        ("CLOCKQ_GPUS", "many", "CLOCKQ_GPUS"),
        ("CLOCKQ_MAX_RETRIES", "-1", "below the minimum"),
        ("CLOCKQ_SERVICE_LADDER_S", "300,x", "is not a comma list of numbers"),
        ("CLOCKQ_SERVICE_LADDER_S", "300,300", "strictly increasing"),
        ("CLOCKQ_SERVICE_LADDER_S", "0,5", "each value must be between"),
    ],
)
def test_a_bad_setting_stops_startup_with_a_clear_error(name, value, message):
    env = {**os.environ, name: value}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr
