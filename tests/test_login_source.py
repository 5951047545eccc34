"""Who a login comes from (clockq/login_source.py): a connection from this host is told apart by
the uid that owns its socket, so that a job's failed logins lock out that job and nobody else.

The rule is tried on real sockets; then a real program running as a job's uid guesses carol's
password at a real Flower and at the real web role (gunicorn, as `make run` starts it), and
carol, from the same address, still gets in to both."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
from contextlib import contextmanager

import pytest
from django.conf import global_settings

from clockq.login_source import UNATTRIBUTED_ADDRESS, LoginSource, SourceKind, login_source
from clockq.stack.roles import web_argv
from tests.harness import ROOT, FlowerServer, Service, free_port, program_python, wait_for
from tests.helpers import database_url

MY_UID = os.geteuid()


@contextmanager
def connection(family: int = socket.AF_INET, listen_on: str = "127.0.0.1", connect_to: str = "127.0.0.1"):
    """A real TCP connection on this host: (client socket, server's socket, peer as the server sees it)."""
    with socket.socket(family) as server:
        server.bind((listen_on, 0))
        server.listen()
        client_family = socket.AF_INET6 if ":" in connect_to else socket.AF_INET
        client = socket.socket(client_family)
        client.connect((connect_to, server.getsockname()[1]))
        accepted, peer = server.accept()
        with accepted:
            yield client, accepted, peer
        client.close()


def source_of(accepted: socket.socket, peer: tuple, job_uids: range | None = None) -> LoginSource:
    return login_source(peer[0], peer[1], accepted.getsockname()[:2], job_uids)


def test_a_connection_from_this_host_is_keyed_by_its_address_unless_its_uid_runs_jobs():
    with connection() as (_client, accepted, peer):
        mine = source_of(accepted, peer, job_uids=range(MY_UID + 1, MY_UID + 10))
        assert mine == LoginSource("127.0.0.1", SourceKind.HOST, MY_UID)
        assert mine.lockout_address == "127.0.0.1"
        as_a_job = source_of(accepted, peer, job_uids=range(MY_UID, MY_UID + 10))
        assert as_a_job == LoginSource("127.0.0.1", SourceKind.JOB, MY_UID)
        assert as_a_job.lockout_address == str(ipaddress.IPv6Address("100::") + MY_UID)
        assert str(as_a_job) == f"127.0.0.1 (job uid {MY_UID})"


@pytest.mark.parametrize(
    ("family", "listen_on", "connect_to"),
    [(socket.AF_INET6, "::1", "::1"), (socket.AF_INET6, "::", "127.0.0.1")],  # the second: dual stack
)
def test_the_owner_is_found_over_ipv6_and_for_an_ipv4_peer_of_a_dual_stack_server(family, listen_on, connect_to):
    with connection(family, listen_on, connect_to) as (_client, accepted, peer):
        assert source_of(accepted, peer, job_uids=range(MY_UID, MY_UID + 1)).uid == MY_UID


def test_a_local_socket_closed_before_the_server_looks_counts_as_a_jobs_with_no_owner():
    # A job that sends its login and closes at once leaves a socket that no process holds, which
    # the kernel lists as root's once in TIME_WAIT: it must not count as the admin's.
    with connection() as (client, accepted, peer):
        client.close()
        source = source_of(accepted, peer, job_uids=range(MY_UID + 1, MY_UID + 10))
    assert source == LoginSource("127.0.0.1", SourceKind.JOB, None)
    assert source.lockout_address == UNATTRIBUTED_ADDRESS == "100::1:0:0"


def test_a_local_address_with_no_port_to_look_up_counts_as_a_jobs_with_no_owner():
    assert login_source("127.0.0.1", None, None, range(1)).kind is SourceKind.JOB


def test_another_machines_address_is_its_own_key():
    source = login_source("192.0.2.1", 40000, ("127.0.0.1", 8000), range(1))
    assert source == LoginSource("192.0.2.1", SourceKind.REMOTE) and source.lockout_address == "192.0.2.1"
    assert login_source("", None, None, range(1)).kind is SourceKind.REMOTE  # a Unix socket's peer


# --- a job guessing at the real Flower and the real web -----------------------------------------

CAROL = ("carol", "carol-pass-123")

# Run as a job's uid, by the system's Python: GUESSES logins to Flower and to the web's login page,
# each with its answer's status printed, as JSON.
GUESSER = r"""
import base64, http.cookiejar, json, re, sys, urllib.error, urllib.parse, urllib.request
flower, web, username, passwords = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])

class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None  # a login's 302 is its answer

cookies = urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
opener = urllib.request.build_opener(cookies, NoRedirect())

def status(request):
    try:
        with opener.open(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code

page = opener.open(web + "/accounts/login/", timeout=30).read().decode()
token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
codes = {"flower": [], "web": []}
for password in passwords:
    login = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    codes["flower"].append(status(urllib.request.Request(flower + "/api/workers", headers={"Authorization": login})))
    form = {"username": username, "password": password, "csrfmiddlewaretoken": token}
    codes["web"].append(status(urllib.request.Request(web + "/accounts/login/", urllib.parse.urlencode(form).encode())))
print(json.dumps(codes))
"""


# Run as a job's uid or this process's user: basic-auth requests to the API, their status codes.
API_GUESSER = r"""
import base64, json, sys, urllib.error, urllib.request
url, username, passwords = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
codes = []
for password in passwords:
    login = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": login}), timeout=30) as r:
            codes.append(r.status)
    except urllib.error.HTTPError as exc:
        codes.append(exc.code)
print(json.dumps(codes))
"""
API_ATTEMPTS = 3  # per minute, source and gunicorn process (the web role runs 2)


def run_as(argv: list[str], uid: int | None) -> str:
    """Run `argv` by the system's Python, as `uid` (a job's) or as this process's user: its stdout."""
    as_uid = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    done = subprocess.run(argv, cwd="/", env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, **as_uid)
    assert done.returncode == 0, done.stderr
    return done.stdout


def guess_api(web_port: int, passwords: list[str], uid: int | None = None) -> list[int]:
    argv = [program_python(), "-c", API_GUESSER, f"http://127.0.0.1:{web_port}/api/jobs", CAROL[0]]
    return json.loads(run_as([*argv, json.dumps(passwords)], uid))


def guess(flower_port: int, web_port: int, passwords: list[str], uid: int | None = None) -> dict[str, list[int]]:
    """Run GUESSER, as `uid` (a job's) or as this process's user: its status codes."""
    argv = [program_python(), "-c", GUESSER, f"http://127.0.0.1:{flower_port}", f"http://127.0.0.1:{web_port}"]
    argv += [CAROL[0], json.dumps(passwords)]
    return json.loads(run_as(argv, uid))


@pytest.fixture
def web(redis_server, settings, tmp_path):
    """gunicorn serving the web role on the test database, as `make run` runs it; its port."""
    port = free_port()
    settings.CLOCKQ_CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_server.url}
    env["CLOCKQ_CHECKPOINT_DIR"] = str(settings.CLOCKQ_CHECKPOINT_DIR)
    # The API's basic auth on, throttled to a few attempts a minute per source and process.
    env.update(CLOCKQ_API_BASIC_AUTH="1", CLOCKQ_API_BASIC_AUTH_RATE=f"{API_ATTEMPTS}/min")
    service = Service("gunicorn", web_argv("127.0.0.1", port), env, ROOT, tmp_path / "gunicorn.log").start()

    def answers() -> bool:
        service.check_alive()
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(answers, 60, interval=0.2, what="gunicorn to listen")
        yield port
    finally:
        service.stop()


@pytest.fixture
def flower(redis_server, tmp_path):
    server = FlowerServer(dict([CAROL]), tmp_path / "flower.log").start(redis_server.url)
    yield server
    server.stop()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(MY_UID != 0, reason="a program runs as a job's uid only when the tests run as root")
def test_a_jobs_wrong_logins_lock_out_the_job_and_never_carol_on_the_same_address(
    django_user_model, settings, flower, web
):
    # Given carol, whose password gunicorn checks with the hasher it has (the default one)
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    django_user_model.objects.create_user(CAROL[0], password=CAROL[1], is_staff=True)
    job_uid = settings.CLOCKQ_COMMAND_UID_BASE + settings.CLOCKQ_COMMAND_UID_COUNT - 1
    # When a program running as a job's uid tries six wrong passwords for her, from 127.0.0.1
    codes = guess(flower.port, web, [f"guess-{i}" for i in range(6)], uid=job_uid)
    # Then the job is locked out after five, from Flower and from the web (django-axes answers
    # the fifth failure itself with its 429)
    assert codes == {"flower": [401] * 5 + [429], "web": [200] * 4 + [429] * 2}
    # And carol, from the same address, gets in to both with her password
    assert guess(flower.port, web, [CAROL[1]]) == {"flower": [200], "web": [302]}
    assert f"from 127.0.0.1 (job uid {job_uid}) locked out" in flower.log_text()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(MY_UID != 0, reason="a program runs as a job's uid only when the tests run as root")
def test_a_job_that_uses_up_the_apis_basic_auth_rate_leaves_carols_on_the_same_address(
    django_user_model, settings, web
):
    # Given carol, and the API's basic auth throttled to API_ATTEMPTS a minute per source
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    django_user_model.objects.create_user(CAROL[0], password=CAROL[1], is_staff=True)
    job_uid = settings.CLOCKQ_COMMAND_UID_BASE + settings.CLOCKQ_COMMAND_UID_COUNT - 1
    # When a job's program, from 127.0.0.1, tries more than both web processes allow it
    codes = guess_api(web, [f"guess-{i}" for i in range(4 * API_ATTEMPTS)], uid=job_uid)
    # Then it is throttled
    assert codes[-1] == 429 and set(codes) <= {401, 429}
    # And carol, from the same address, is not: her password gets her in
    assert guess_api(web, [CAROL[1]]) == [200]
