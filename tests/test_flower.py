"""The flower role (clockq/flower.py): repeated failed logins are locked out, a flood of made-up
usernames does not flush the count, and no page or API shows the broker's password. The
integration tests run the real `python -m clockq.flower` and a real worker against a private
Redis with a password, as `make run`'s embedded broker has. The counts themselves are tried in
tests/test_login_lockout.py, and a job's logins in tests/test_login_source.py."""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import sys

import pytest

from clockq.celery import without_url_passwords
from clockq.flower import basic_credentials
from tests.harness import ROOT, FlowerServer, RedisServer, Service, wait_for

ADMIN = ("admin", "admin-pass-123")
CAROL = ("carol", "carol-pass-123")
BOB = ("bob", "bob-pass-123")


@pytest.mark.parametrize(
    ("header", "credentials"),
    [
        ("Basic Y2Fyb2w6cHc=", "carol:pw"),
        ("Basic  Y2Fyb2w6cHc=", "carol:pw"),
        ("basic Y2Fyb2w6cHc=", None),  # Flower wants "Basic" as written
        ("Bearer abc", None),
        ("Basic !!!", ""),  # b64decode drops what is not base64, as in Flower: an empty login
        ("Basic", None),
        ("", None),
    ],
)
def test_basic_credentials_are_read_as_flower_reads_them(header, credentials):
    assert basic_credentials(header) == credentials


def test_url_passwords_are_masked_however_deep():
    conf = {
        "REDIS_URL": "redis://:hunter2@10.0.0.1:6379/0",
        "CACHES": {"default": {"LOCATION": ["rediss://user:hunter2@cache:6380/1"]}},
        "LOGIN_URL": "login",
        "PLAIN": "ssh://git@example.com/repo",
        "N": 3,
    }
    masked = without_url_passwords(conf)
    assert "hunter2" not in json.dumps(masked)
    assert masked["REDIS_URL"] == "redis://:********@10.0.0.1:6379/0"
    assert masked["LOGIN_URL"] == "login" and masked["PLAIN"] == conf["PLAIN"] and masked["N"] == 3


# --- a real Flower ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("broker"), password=f"broker-{secrets.token_hex(12)}").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def flower(broker, tmp_path_factory):
    server = FlowerServer(dict([ADMIN, CAROL, BOB]), tmp_path_factory.mktemp("flower") / "flower.log").start(broker.url)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    """One real clockq worker (the control worker: no GPU, solo pool), for its `conf` reply."""
    from clockq.stack.roles import control_worker_argv

    argv = control_worker_argv(host="flowertest")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ROOT), "REDIS_URL": broker.url}
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = Service("control worker", argv, env, ROOT, log_path).start()
    yield "control@flowertest"
    worker.stop(grace_s=30)


@pytest.mark.integration
def test_ten_wrong_passwords_lock_the_login_out_and_the_right_one_is_refused_then(flower):
    # Given carol's login works
    assert flower.get("/api/workers", CAROL)[0] == 200
    # When ten wrong passwords are tried for her
    codes = [flower.get("/api/workers", ("carol", f"guess-{i}"))[0] for i in range(10)]
    # Then the sixth on is refused without a look at the password, and so is the right one now
    assert codes == [401] * 5 + [429] * 5
    status, headers, body = flower.get("/api/workers", CAROL)
    assert status == 429 and "Too many failed logins" in body and int(headers["Retry-After"]) > 800
    assert flower.get("/api/task/revoke/00000000-0000-0000-0000-000000000000", CAROL, method="POST")[0] == 429
    # And another user from the same address still gets in
    assert flower.get("/api/workers", ADMIN)[0] == 200
    assert "locked out" in flower.log_path.read_text()


def basic_auth_statuses(flower: FlowerServer, logins) -> list[int]:
    """The status of one basic-auth request to Flower per (username, password) of `logins`, on one
    kept-alive connection (a flood's pace)."""
    connection = http.client.HTTPConnection("127.0.0.1", flower.port, timeout=30)
    statuses = []
    try:
        for login in logins:
            header = "Basic " + base64.b64encode(":".join(login).encode()).decode()
            connection.request("GET", "/api/task/types", headers={"Authorization": header})
            response = connection.getresponse()
            response.read()
            statuses.append(response.status)
    finally:
        connection.close()
    return statuses


@pytest.mark.slow  # 30,000 requests, about 30 s; tests/test_login_lockout.py has the same flood in 0.2 s
@pytest.mark.integration
def test_a_flood_of_junk_usernames_does_not_flush_bobs_count(flower):
    # Given bob's login works
    assert flower.get("/api/workers", BOB)[0] == 200
    # When three rounds of 4 wrong passwords for him, each followed by 10,001 made-up usernames
    # (one more than a table holds), come from one address
    rounds = []
    for r in range(3):
        rounds.append(basic_auth_statuses(flower, [("bob", f"guess-{r}-{i}") for i in range(4)]))
        junk = basic_auth_statuses(flower, [(f"junk-{r}-{i}", "x") for i in range(10_001)])
        assert set(junk) <= {401, 429}
    # Then his fifth failure locked him out, and the right password is refused too
    assert rounds == [[401] * 4, [401] + [429] * 3, [429] * 4]
    assert flower.get("/api/workers", BOB)[0] == 429


@pytest.mark.integration
def test_no_page_or_api_shows_the_broker_password(flower, worker, broker):
    # Given a live worker whose configuration Flower has read (its broker URL holds the password)
    def conf_read():
        status, _headers, body = flower.get("/api/workers?refresh=1", ADMIN)
        return status == 200 and json.loads(body).get(worker, {}).get("conf")

    conf = wait_for(conf_read, 60, interval=0.5, what="Flower to read the worker's conf")
    assert conf["REDIS_URL"].startswith("redis://:********@") and conf["CELERY_BROKER_URL"] == conf["REDIS_URL"]
    # Then no page or API answer holds the password
    paths = ["/", "/workers", "/api/workers?refresh=1", f"/worker/{worker}", "/broker", "/tasks", "/api/tasks"]
    paths += ["/api/task/types", "/api/queues/length", "/metrics", "/healthcheck"]
    for path in paths:
        status, _headers, body = flower.get(path, ADMIN)
        assert status == 200, path
        assert broker.password not in body, path
    assert "REDIS_URL" in flower.get(f"/worker/{worker}", ADMIN)[2]  # the page that shows the conf
    assert broker.password not in flower.log_path.read_text()


def test_the_worker_answers_conf_with_clockqs_command():
    from celery.worker.control import Panel

    from clockq import celery

    assert Panel.data["conf"] is celery._conf_without_passwords
    assert sys.modules["clockq.celery"] is celery
