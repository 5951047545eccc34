"""What `make run` does to the files it keeps under var/."""

from __future__ import annotations

import os
import stat

import pytest

from clockq.management.commands.runstack import _without_password, protect_var_dir


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def keep_umask():
    saved = os.umask(0o022)
    os.umask(saved)
    yield
    os.umask(saved)


def test_var_files_become_private_and_the_folder_unlistable(tmp_path, keep_umask):
    var = tmp_path / "var"
    (var / "redis").mkdir(parents=True)
    (var / "clockq.sqlite3").write_text("db")
    (var / "clockq.sqlite3").chmod(0o644)
    (var / "redis" / "appendonly.aof").write_text("aof")
    protect_var_dir(var)
    assert mode(var) == 0o711 and mode(var / "redis") == 0o700
    assert mode(var / "clockq.sqlite3") == 0o600
    (var / "new-file").write_text("x")  # the umask now covers new files too
    assert mode(var / "new-file") == 0o600


def test_the_banner_never_shows_the_broker_password():
    assert _without_password("redis://:hunter2@127.0.0.1:6390/0") == "redis://:***@127.0.0.1:6390/0"
    assert _without_password("redis://127.0.0.1:6390/0") == "redis://127.0.0.1:6390/0"
