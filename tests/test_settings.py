"""Settings from the environment: good values parse, bad ones fail loudly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from clockq.env import env_bool, env_float, env_int, env_or_file, parse_gpus
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
        ("REDIS_URL", "redis://broker:99999/0", "REDIS_URL: not a valid URL"),
        ("REDIS_URL", "redis:///0", "names no host"),
        ("REDIS_URL", "redis://broker:6379/zero", "database number"),
        ("DATABASE_URL", "postgres://clockq@db:5432/", "names no database"),
        ("SECRET_KEY", "changeme", "SECRET_KEY is shorter than 32 characters"),
        ("CLOCKQ_HOST", "gpu host", "CLOCKQ_HOST='gpu host'"),
        ("CLOCKQ_HOST", "a@b", "CLOCKQ_HOST='a@b'"),
        ("CLOCKQ_CHECKPOINT_DIR", "var/ckpt", "not an absolute path"),
        ("DATABASE_URL_FILE", "/nonexistent/db-url", "DATABASE_URL_FILE='/nonexistent/db-url': cannot read it"),
        ("CLOCKQ_BEAT_LOCK_S", "1", "CLOCKQ_BEAT_LOCK_S=1.0 is outside"),
        ("CLOCKQ_WARM_WAIT_S", "60", "CLOCKQ_WARM_WAIT_S=60.0 is outside [0.0, 10.0]"),
        ("CLOCKQ_WARM_WAIT_S", "soon", "CLOCKQ_WARM_WAIT_S='soon' is not a number"),
    ],
)
def test_a_bad_setting_stops_startup_with_a_clear_error(name, value, message):
    env = {**os.environ, name: value}
    if name.endswith("_FILE"):
        env.pop(name.removesuffix("_FILE"), None)  # CI's PostgreSQL pass sets DATABASE_URL
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_a_setting_comes_from_the_environment_or_from_the_file_its_FILE_variable_names(monkeypatch, tmp_path):
    secret = tmp_path / "database_url"
    secret.write_text("postgres://clockq:s3cret@db:5432/clockq\n")  # as a secret file ends
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("DATABASE_URL_FILE", str(secret))
    assert env_or_file("DATABASE_URL") == "postgres://clockq:s3cret@db:5432/clockq"

    monkeypatch.setenv("DATABASE_URL", "postgres://other@db/x")
    with pytest.raises(ImproperlyConfigured, match="both DATABASE_URL and DATABASE_URL_FILE are set"):
        env_or_file("DATABASE_URL")
    monkeypatch.delenv("DATABASE_URL")
    secret.write_text("\n")
    with pytest.raises(ImproperlyConfigured, match="the file is empty"):
        env_or_file("DATABASE_URL")
    secret.write_text("one\ntwo\n")
    with pytest.raises(ImproperlyConfigured, match="more than one line") as refused:
        env_or_file("DATABASE_URL")
    assert "two" not in str(refused.value)  # the value (a secret) is never shown
    monkeypatch.delenv("DATABASE_URL_FILE")
    assert env_or_file("DATABASE_URL") is None


def test_every_role_reads_its_settings_from_files(tmp_path):
    files = {
        "SECRET_KEY": "k" * 40,
        "REDIS_URL": "redis://:pw@broker.internal:6379/2",
        "CLOCKQ_CHECKPOINT_DIR": str(tmp_path / "shared"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }
    env = {k: v for k, v in os.environ.items() if k not in files}
    for name, value in files.items():
        (tmp_path / name).write_text(value + "\n")
        env[f"{name}_FILE"] = str(tmp_path / name)
    probe = (
        "from django.conf import settings as s; "
        "print(s.SECRET_KEY == 'k' * 40, s.REDIS_URL, s.CLOCKQ_CHECKPOINT_DIR, s.DATABASES['default']['NAME'], "
        "s.CLOCKQ_EMBEDDED_BROKER)"
    )
    argv = [sys.executable, "manage.py", "shell", "-v", "0", "-c", probe]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "True",
        files["REDIS_URL"],
        files["CLOCKQ_CHECKPOINT_DIR"],
        str(tmp_path / "db.sqlite3"),
        "False",
    ]
