"""`clockq` against a server that is broken or hostile: a small HTTP server started by each test
answers garbage, JSON of the wrong shape, bodies without end and pages without end. Every such
answer is one line on stderr and a non-zero exit, never a traceback, and the server counts how
many requests the CLI made: a bounded number."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from clockq_cli.client import MAX_ANSWER_BYTES
from clockq_cli.config import DEFAULT_MAX_PAGES
from clockq_cli.exits import MAX_MESSAGE_CHARS
from tests.clockq_cli.conftest import Clockq, no_traceback


@dataclass
class Reply:
    status: int = 200
    body: bytes | Iterator[bytes] = b""
    content_type: str = "application/json"


def as_json(data, status: int = 200) -> Reply:
    return Reply(status, json.dumps(data).encode())


@dataclass
class HostileServer:
    """Answers every request with `answer(path, query)`, and counts the requests."""

    answer: Callable[[str, dict[str, str]], Reply] = lambda path, query: Reply()
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def serve(self) -> ThreadingHTTPServer:
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hostile.requests.append(self.path)
                parts = urlsplit(self.path)
                reply = hostile.answer(parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()})
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                if isinstance(reply.body, bytes):
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                    return
                self.end_headers()  # no length: the body ends when the server closes it, or never
                try:
                    for chunk in reply.body:
                        self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the CLI stopped reading, as it should

            do_POST = do_GET

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return server


def start(hostile: HostileServer) -> Iterator[HostileServer]:
    server = hostile.serve()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hostile
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server():
    yield from start(HostileServer())


@pytest.fixture
def elsewhere():
    """Another server, the host a hostile `next` link points to: it must never hear from the CLI."""
    yield from start(HostileServer())


@pytest.fixture
def cli(server, tmp_path) -> Clockq:
    return Clockq(url=server.url, token="alice-token", config_home=tmp_path / "config", cwd=tmp_path)


def job(job_id: int, **fields) -> dict:
    return {"id": job_id, "name": f"job-{job_id}", "owner": "alice", "state": "queued", "tier": "SP", **fields}


def refused(ran, *, code: int = 1) -> str:
    """The one line a refused answer gives, with its exit code."""
    assert ran.code == code, (ran.code, ran.out, ran.err)
    no_traceback(ran)
    return ran.err.strip()


def endless(chunk: bytes) -> Iterator[bytes]:
    return itertools.repeat(chunk)


@pytest.mark.parametrize(
    ("args", "reply", "says"),
    [
        (["jobs"], Reply(200, b"<html>hello</html>", "text/html"), "(HTTP 200, text/html)"),
        (["jobs"], as_json([1, 2, 3]), "the answer is a list, not an object"),
        (["jobs"], as_json({"count": 1, "results": [{"id": 1}]}), "the answer.results[0].name is missing"),
        (["jobs"], as_json({"count": "many", "results": []}), "the answer.count is text, not a whole number"),
        (["jobs"], as_json({"count": 1, "results": [job(True)]}), "results[0].id is true or false, not a whole"),
        (["jobs"], Reply(200, b'{"count": NaN, "results": []}'), "the answer.count is a number, not a whole number"),
        (["jobs"], Reply(200, b"[" * 100_000), "did not answer as clockq's API does (HTTP 200"),
        (["show", "1"], as_json(job(1, name=5)), "the answer.name is a number, not text"),
        (["jobs"], as_json({"count": 1, "results": [job(1, gpus="2")]}), "results[0].gpus is text, not a whole"),
        (["show", "1"], as_json(job(1, wait_ms=float("inf"))), None),
        (["queues"], as_json({"tiers": "RT"}), "the answer.tiers is text, not a list"),
        (["queues"], as_json({"tiers": [], "workers": [{"started": "yesterday"}]}), "workers[0].started is text"),
        (["gpus"], as_json({"gpus": [{"power_w": "hot"}]}), "gpus[0].power_w is text, not a number"),
        (["hosts"], as_json({"hosts": [{"name": "a", "running_jobs": [None]}]}), "running_jobs[0] is null"),
        (["jobs"], as_json({"x": json.loads("{" + '"x":{' * 600 + "}" * 601)}, 400), "too deeply"),
        (["jobs"], as_json({"detail": "no\nsuch\x1b[2J" + "!" * 1_000_000}, 400), "no\\nsuch\\x1b[2J!!!"),
    ],
)
def test_a_malformed_answer_is_one_line_and_exit_1(cli, server, args, reply, says):
    # Given a server that answers every request so
    server.answer = lambda path, query: reply

    # When the CLI asks it
    line = refused(cli(*args))

    # Then it says what is wrong in one line (not a flood), from one request
    if says is not None:
        assert says in line, line
    assert len(line) <= len("Error: ") + MAX_MESSAGE_CHARS and len(server.requests) == 1, server.requests


def test_an_answer_without_end_is_refused_after_16_mib(cli, server):
    # A Content-Length the CLI would have to believe, and a body that never ends
    server.answer = lambda path, query: Reply(200, endless(b'{"count": 0, "results": [' + b" " * 65536))
    line = refused(cli("jobs"))
    assert f"larger than {MAX_ANSWER_BYTES >> 20} MiB" in line and len(server.requests) == 1


def test_the_same_next_link_again_is_a_loop(cli, server):
    # Given a server whose every page says the next one is page 2, with the same job on it
    page = {"count": 10**9, "next": f"{server.url}/api/jobs?page=2", "results": [job(1)]}
    server.answer = lambda path, query: as_json(page)

    # Then the CLI stops at the second page, saying its pages loop
    line = refused(cli("jobs", "--limit", "1000"))
    assert "its pages loop" in line and len(server.requests) == 2


def test_pages_that_list_no_new_job_are_a_loop(cli, server):
    # Given a server whose pages never end and list no job at all
    server.answer = lambda path, query: as_json(
        {"count": 10**9, "next": f"{server.url}/api/jobs?page={int(query['page']) + 1}", "results": []}
    )
    line = refused(cli("jobs"))
    assert "no job not listed before" in line and len(server.requests) == 1


def test_pages_without_end_stop_at_the_limit_or_the_page_bound(cli, server):
    # Given a server whose pages never end, each with a job not seen before
    def page(path, query):
        number = int(query["page"])
        return as_json({"count": 10**9, "next": f"{server.url}/api/jobs?page={number + 1}", "results": [job(number)]})

    server.answer = page

    # When the CLI asks for 3 jobs, it reads 3 pages and is done
    done = cli("jobs", "--limit", "3", "--json")
    assert done.code == 0 and len(done.json()["jobs"]) == 3 and len(server.requests) == 3

    # When it asks for more than the pages it may read, it stops at the bound and says how to raise it
    server.requests.clear()
    line = refused(cli("jobs", "--limit", "100000"))
    assert f"more than {DEFAULT_MAX_PAGES} pages" in line and "CLOCKQ_MAX_PAGES" in line
    assert len(server.requests) == DEFAULT_MAX_PAGES
    server.requests.clear()
    assert "more than 5 pages" in refused(cli("jobs", "--limit", "100000", CLOCKQ_MAX_PAGES="5"))
    assert len(server.requests) == 5
    # And a bound that is not a number is a usage error, before any request
    server.requests.clear()
    assert "CLOCKQ_MAX_PAGES must be a whole number" in refused(cli("jobs", CLOCKQ_MAX_PAGES="lots"), code=2)
    assert server.requests == []


def test_a_next_link_to_another_host_takes_nothing_there(cli, server, elsewhere):
    # Given a server whose next page is said to be on another host, with the same job again
    server.answer = lambda path, query: as_json({"count": 2, "next": f"{elsewhere.url}/steal", "results": [job(1)]})

    # Then the CLI asks its own server for page 2, finds it loops, and the other host hears nothing
    line = refused(cli("jobs"))
    assert "its pages loop" in line
    assert [parse_qs(urlsplit(p).query)["page"] for p in server.requests] == [["1"], ["2"]]
    assert all(urlsplit(p).path == "/api/jobs" for p in server.requests)
    assert elsewhere.requests == []


def test_a_result_file_longer_than_its_manifest_says_is_cut_off_and_not_kept(cli, server, tmp_path):
    # Given a job whose result is one file of 10 bytes, which the server sends without end
    manifest = {"job": 1, "bytes": 10, "files": [{"name": "model.bin", "bytes": 10, "sha256": "0" * 64}]}
    server.answer = lambda path, query: (
        as_json(manifest) if path.endswith("/result") else Reply(200, endless(b"x" * 65536), "application/octet-stream")
    )

    # When the CLI downloads it, it stops reading, says so, and leaves nothing behind
    line = refused(cli("result", "1", "-o", str(tmp_path / "out")), code=7)
    assert "model.bin: got" in line
    assert list((tmp_path / "out").iterdir()) == []
