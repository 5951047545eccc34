"""The scale-out hook: a real local HTTP server and real commands; failures raise a clear error,
and the Celery task retries them and logs each one."""

from __future__ import annotations

import base64
import json
import re
import shlex
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.exceptions import ImproperlyConfigured

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.control_state import scale_hook
from clockq.control_state.control import apply_forecast, force_state
from clockq.control_state.scale_hook import ScaleHookFailed, call_scale_hook, request_scale_out
from clockq.env import parse_scale_hook
from clockq.policy import control as rules
from control.tasks import SCALE_OUT_MAX_RETRIES, scale_out
from tests.harness import is_alive, wait_for


class Hook:
    """A webhook on 127.0.0.1: answers each POST with the next status of `statuses` (the last
    one repeats) and keeps what it was sent."""

    def __init__(self) -> None:
        self.statuses = [200]
        self.received: list[dict] = []
        self.headers: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append(json.loads(body))
                hook.headers.append(dict(self.headers))
                status = hook.statuses.pop(0) if len(hook.statuses) > 1 else hook.statuses[0]
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"ok" if status < 400 else b"autoscaler is down")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/secret-path-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(settings):
    hook = Hook()
    settings.CLOCKQ_SCALE_HOOK = hook.url
    yield hook
    hook.close()


def python_command(code: str, *args: str) -> str:
    return shlex.join([sys.executable, "-c", code, *args])


WRITE_STDIN = "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"


# --- the hook itself -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_webhook_gets_the_desired_count_as_json(webhook):
    hook = call_scale_hook(6, 4, 0.93, "scale out to 6")

    assert hook is not None and hook.url == webhook.url
    assert webhook.received == [
        {"desired_workers": 6, "current_workers": 4, "forecast": 0.93, "reason": "scale out to 6"}
    ]
    assert webhook.headers[0]["Content-Type"] == "application/json"


@pytest.mark.django_db
def test_a_command_reads_the_json_on_stdin(settings, tmp_path):
    out = tmp_path / "got it.json"  # a space: the command line is split like a shell would
    settings.CLOCKQ_SCALE_HOOK = python_command(WRITE_STDIN, str(out))

    call_scale_hook(3, 2, None, "by hand")

    assert json.loads(out.read_text()) == {
        "desired_workers": 3,
        "current_workers": 2,
        "forecast": None,
        "reason": "by hand",
    }


@pytest.mark.django_db
def test_no_hook_configured_is_nothing_to_do(settings):
    settings.CLOCKQ_SCALE_HOOK = None
    assert call_scale_hook(3, 2, 0.9, "x") is None


@pytest.mark.django_db
def test_a_webhook_answering_500_fails_clearly_without_leaking_its_path(webhook):
    webhook.statuses = [500]

    with pytest.raises(ScaleHookFailed) as failed:
        call_scale_hook(6, 4, 0.93, "r")

    message = str(failed.value)
    assert "HTTP 500" in message and "autoscaler is down" in message
    assert "secret-path-token" not in message and "127.0.0.1" in message


@pytest.mark.django_db
def test_a_webhook_that_is_not_listening_fails_clearly(settings):
    hook = Hook()
    settings.CLOCKQ_SCALE_HOOK = hook.url
    hook.close()

    with pytest.raises(ScaleHookFailed, match=r"failed: .*refused"):
        call_scale_hook(6, 4, 0.93, "r")


@pytest.mark.django_db
def test_a_redirect_is_refused(webhook):
    webhook.statuses = [307]
    with pytest.raises(ScaleHookFailed, match="HTTP 307"):
        call_scale_hook(6, 4, 0.93, "r")


@pytest.mark.django_db
def test_a_command_exiting_1_fails_with_its_stderr(settings):
    settings.CLOCKQ_SCALE_HOOK = python_command("import sys; sys.exit('no capacity left in the rack')")

    with pytest.raises(ScaleHookFailed, match="exited with status 1: no capacity left in the rack"):
        call_scale_hook(6, 4, 0.93, "r")


@pytest.mark.django_db
def test_a_missing_program_fails_clearly(settings, tmp_path):
    settings.CLOCKQ_SCALE_HOOK = str(tmp_path / "no-such-scaler")
    with pytest.raises(ScaleHookFailed, match="could not start: No such file"):
        call_scale_hook(6, 4, 0.93, "r")


@pytest.mark.django_db
def test_a_command_that_hangs_is_killed_with_what_it_started(settings, tmp_path):
    # A shell script whose child keeps the output pipes open: killing the shell alone would not
    # do. Neither would ever end by itself.
    pids = tmp_path / "pids"
    settings.CLOCKQ_SCALE_HOOK = f"sh -c 'sleep 3600 & echo $! $$ > {pids}; sleep 3600'"
    failed: list[BaseException] = []

    def call():
        try:
            call_scale_hook(6, 4, 0.93, "r", timeout_s=0.5)
        except BaseException as exc:
            failed.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    caller.join(60)  # a hook left to end by itself would hang here for the hour

    assert not caller.is_alive(), "the hook was not killed"
    assert len(failed) == 1 and isinstance(failed[0], ScaleHookFailed), failed
    assert re.search(r"timed out after 0\.5 s", str(failed[0]))
    started = pids.read_text().split() if pids.exists() else []  # none yet, on a slow machine
    # SIGKILL is delivered when the killed process next runs, and the shell's orphan is no child
    # of ours to wait for: wait for the deaths (a hook left alive would sleep on for the hour).
    wait_for(lambda: not any(is_alive(int(pid)) for pid in started), 30, "the hook's processes to die")


def test_the_setting_is_a_url_or_a_command():
    assert parse_scale_hook("https://scaler.example/hook?k=1").url == "https://scaler.example/hook?k=1"
    assert parse_scale_hook("/usr/local/bin/scale --pool 'gpu a'").argv == ("/usr/local/bin/scale", "--pool", "gpu a")
    assert parse_scale_hook("https://user:pw@h:8443/p/t").describe() == "POST https://h:8443/..."
    for bad, why in (
        ("", "empty"),
        ("ftp://h/x", "only http:// and https://"),
        ("scale 'unclosed", "cannot split"),
        ("http:///nohost", "no host"),
        ("http://h:99999/", "not a valid URL"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_scale_hook(bad)


def test_a_bad_setting_stops_startup():
    import os
    import subprocess

    from tests.harness import ROOT

    done = subprocess.run(
        [sys.executable, "-c", "import clockq.settings"],
        cwd=ROOT,
        env={**os.environ, "CLOCKQ_SCALE_HOOK": "scale 'unclosed"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert ImproperlyConfigured.__name__ in done.stderr and "CLOCKQ_SCALE_HOOK: cannot split" in done.stderr


# --- the Celery task: retried, logged --------------------------------------------------------------


@pytest.mark.django_db
def test_the_task_retries_a_failing_hook_and_logs_each_failure(webhook, caplog):
    webhook.statuses = [500, 503, 200]

    result = scale_out.apply(kwargs={"desired": 5, "current": 3, "forecast": 0.8, "reason": "r"})

    assert result.successful() and result.result is True
    assert [r["desired_workers"] for r in webhook.received] == [5, 5, 5]
    warnings = [r.getMessage() for r in caplog.records if r.name == "clockq.tasks"]
    assert warnings == [
        "scale out to 5: try 1 of 6 failed, retrying: scale hook POST http://127.0.0.1:"
        f"{webhook.server.server_address[1]}/... answered HTTP 500 Internal Server Error: autoscaler is down",
        "scale out to 5: try 2 of 6 failed, retrying: scale hook POST http://127.0.0.1:"
        f"{webhook.server.server_address[1]}/... answered HTTP 503 Service Unavailable: autoscaler is down",
    ]


@pytest.mark.django_db
def test_the_task_gives_up_after_its_retries_and_says_so(settings, tmp_path, caplog):
    tries = tmp_path / "tries"
    settings.CLOCKQ_SCALE_HOOK = python_command(
        "import sys; open(sys.argv[1], 'a').write('x'); sys.exit(1)", str(tries)
    )

    result = scale_out.apply(kwargs={"desired": 5, "current": 3, "forecast": 0.8, "reason": "r"})

    assert result.failed() and isinstance(result.result, ScaleHookFailed)
    assert tries.read_text() == "x" * (SCALE_OUT_MAX_RETRIES + 1)
    ours = [r for r in caplog.records if r.name == "clockq.tasks"]
    levels = [(r.levelname, r.getMessage().split(":")[0]) for r in ours]
    assert levels == [("WARNING", "scale out to 5")] * SCALE_OUT_MAX_RETRIES + [("ERROR", "scale out to 5")]
    assert "giving up after 6 tries: scale hook command" in ours[-1].getMessage()
    assert "exited with status 1" in ours[-1].getMessage()


def test_the_task_backs_off_exponentially():
    assert scale_out.autoretry_for == (ScaleHookFailed,)
    assert (scale_out.max_retries, scale_out.retry_backoff, scale_out.retry_jitter) == (5, 2, True)


@pytest.mark.django_db
def test_a_late_retry_does_not_undo_a_newer_count(webhook):
    force_state(actor="op", desired_workers=8)

    assert scale_out.apply(kwargs={"desired": 5, "current": 3, "forecast": 0.8, "reason": "r"}).result is False
    assert webhook.received == []
    # the current count and the forecast are looked up when the request did not carry them
    heartbeat.announce(broker(), {"hostname": "gpu0@h", "gpu": 0})
    heartbeat.announce(broker(), {"hostname": "control@h", "gpu": None})
    assert scale_out.apply(kwargs={"desired": 8, "reason": "forced"}).result is True
    assert webhook.received == [{"desired_workers": 8, "current_workers": 1, "forecast": None, "reason": "forced"}]


# --- requesting a scale-out after a forecast -----------------------------------------------------


def _control_messages() -> list[dict]:
    out = []
    for raw in broker().lrange("control", 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "clockq.scale_out":
            _args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            out.append(kwargs)
    return out


@pytest.mark.django_db
def test_a_changed_desired_count_is_sent_on_commit(webhook, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        decisions = apply_forecast(0.95, workers=4)
        assert request_scale_out(decisions, current=4, forecast=0.95) is True
        assert _control_messages() == []  # not before the commit

    [sent] = _control_messages()
    assert sent["desired"] == 6 and sent["current"] == 4 and sent["forecast"] == 0.95  # ceil(4 x 0.95 / 0.7)
    assert sent["reason"].startswith("scale out to 6 GPU worker(s) from 4")
    # run it as the control worker would
    assert scale_out.apply(kwargs=sent).result is True
    assert webhook.received[0]["desired_workers"] == 6


@pytest.mark.django_db
def test_nothing_is_sent_without_a_change_or_a_hook(settings, django_capture_on_commit_callbacks):
    unchanged = [rules.Decision(rules.WORKERS, 4, 4, "as now"), rules.Decision(rules.ADMISSION, True, False, "x")]
    changed = [rules.Decision(rules.WORKERS, 4, 6, "more")]
    settings.CLOCKQ_SCALE_HOOK = "true"
    with django_capture_on_commit_callbacks(execute=True):
        assert request_scale_out(unchanged) is False
        assert request_scale_out([]) is False
    settings.CLOCKQ_SCALE_HOOK = None
    with django_capture_on_commit_callbacks(execute=True):
        assert request_scale_out(changed) is False
    assert _control_messages() == []


@pytest.mark.django_db
def test_a_broker_error_is_logged_not_raised(settings, monkeypatch, caplog, django_capture_on_commit_callbacks):
    settings.CLOCKQ_SCALE_HOOK = "true"

    def broker_down(*args, **kwargs):
        raise ConnectionError("broker down")

    from clockq.celery import app

    monkeypatch.setattr(app, "send_task", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        assert request_scale_out([rules.Decision(rules.WORKERS, 4, 6, "more")]) is True

    assert "could not send the scale-out request (6 GPU workers): broker down" in caplog.text
    assert scale_hook.SCALE_OUT_TASK == "clockq.scale_out"
