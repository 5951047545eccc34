"""The embedded broker's command line: a password kept off the command line, CONFIG disabled."""

from __future__ import annotations

import subprocess

import pytest
import redis

from clockq.bus.redis_server import redis_server_argv
from tests.harness import free_port, wait_for


def test_the_embedded_broker_wants_its_password_and_refuses_config(tmp_path):
    port = free_port()
    argv = redis_server_argv(port, tmp_path, durable=True, password="s3cret-pw")
    assert "s3cret-pw" not in " ".join(argv)  # `ps` shows argv to every local user
    assert oct((tmp_path / "redis.conf").stat().st_mode & 0o777) == "0o600"
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        good = redis.Redis(port=port, password="s3cret-pw")

        def answers():
            try:
                return good.ping()
            except redis.ConnectionError:
                return False

        wait_for(answers, 10, what="redis-server to answer")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        with pytest.raises(redis.ResponseError, match="unknown command"):
            good.config_get("dir")
        good.set("k", "v")
        assert (tmp_path / "appendonlydir").exists() or (tmp_path / "appendonly.aof").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
