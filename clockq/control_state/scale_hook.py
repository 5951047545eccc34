"""The scale-out hook, for operators without Kubernetes (with it, an autoscaler reads
`clockq_desired_gpu_workers` from /metrics; see compose/).

CLOCKQ_SCALE_HOOK is either an http:// or https:// URL, which gets a JSON POST, or a command
line, split like a shell would (no shell runs it), whose program reads the same JSON on stdin:

    {"desired_workers": 6, "current_workers": 4, "forecast": 0.93, "reason": "scale out to 6 ..."}

Either must succeed (2xx; exit status 0) within HOOK_TIMEOUT_S. Staff configure it, so the
command runs as clockq's user, with clockq's environment.

When the controller's desired worker count changes, `request_scale_out` sends the Celery task
`clockq.scale_out` (control queue) after the transaction commits; the task calls
`call_scale_hook`, and retries a failure with exponential backoff. Neither ever blocks nor fails
the forecast: a broker error while sending is logged, and the forecast goes on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from clockq.bus import heartbeat
from clockq.control_state.models import ControlState
from clockq.env import ScaleHook, parse_scale_hook
from clockq.policy import control as rules

log = logging.getLogger("clockq.scale")

SCALE_OUT_TASK = "clockq.scale_out"
HOOK_TIMEOUT_S = 30.0
MAX_OUTPUT_CHARS = 500
# Sending the task must not hang the forecast when the broker is down: one immediate retry, each
# try bounded by CLOCKQ_BROKER_TIMEOUT_S (as the dispatch message does).
_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0, "interval_max": 0}


class ScaleHookFailed(RuntimeError):
    """The hook could not be called or said no; the message says which hook and why."""


def configured_hook() -> ScaleHook | None:
    raw = settings.CLOCKQ_SCALE_HOOK
    if not raw:
        return None
    try:
        return parse_scale_hook(raw)
    except ValueError as exc:
        raise ScaleHookFailed(f"CLOCKQ_SCALE_HOOK is not usable: {exc}") from None


def payload(desired: int, current: int, forecast: float | None, reason: str) -> dict[str, Any]:
    return {"desired_workers": desired, "current_workers": current, "forecast": forecast, "reason": reason}


def call_scale_hook(
    desired: int, current: int, forecast: float | None, reason: str, timeout_s: float = HOOK_TIMEOUT_S
) -> ScaleHook | None:
    """Tell the configured hook how many GPU workers are wanted. Returns the hook (None when none
    is configured: nothing to do). Raises ScaleHookFailed when it fails, times out or says no."""
    hook = configured_hook()
    if hook is None:
        return None
    body = json.dumps(payload(desired, current, forecast, reason), allow_nan=False).encode()
    if hook.url is not None:
        _post(hook, body, timeout_s)
    else:
        _run(hook, body, timeout_s)
    log.info("scale hook (%s) told: %s GPU worker(s) wanted, %s now", hook.describe(), desired, current)
    return hook


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect would turn the POST into a GET (or resend the body elsewhere): refuse it."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def _post(hook: ScaleHook, body: bytes, timeout_s: float) -> None:
    assert hook.url is not None
    request = urllib.request.Request(
        hook.url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "clockq-scale-hook"},
    )
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            response.read(64 * 1024)
    except urllib.error.HTTPError as exc:
        text = _tail(exc.read(4096)) if exc.fp is not None else ""
        raise ScaleHookFailed(
            f"scale hook {hook.describe()} answered HTTP {exc.code} {exc.reason}" + (f": {text}" if text else "")
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise ScaleHookFailed(f"scale hook {hook.describe()} failed: {why}") from None


def _run(hook: ScaleHook, body: bytes, timeout_s: float) -> None:
    try:
        # Its own session, so a timeout kills whatever it started too (a script's children would
        # otherwise hold its output pipes open, and waiting for them would hang this task).
        process = subprocess.Popen(
            list(hook.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise ScaleHookFailed(f"scale hook {hook.describe()} could not start: {exc.strerror or exc}") from None
    try:
        _out, err = process.communicate(body, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise ScaleHookFailed(f"scale hook {hook.describe()} timed out after {timeout_s:g} s (killed)") from None
    if process.returncode != 0:
        text = _tail(err)
        raise ScaleHookFailed(
            f"scale hook {hook.describe()} exited with status {process.returncode}" + (f": {text}" if text else "")
        )


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a child escaped its session
        process.kill()


def _tail(raw: bytes | None) -> str:
    text = (raw or b"").decode(errors="replace").strip()
    return text[-MAX_OUTPUT_CHARS:]


def request_scale_out(
    decisions: Iterable[rules.Decision], *, current: int | None = None, forecast: float | None = None
) -> bool:
    """After apply_forecast (or an operator's override): if the desired GPU worker count changed
    and a hook is configured, send `clockq.scale_out` once the transaction commits. `current`
    and `forecast` default to what the task finds (live GPU workers, the control state). Never
    blocks or raises: a broker error is logged. Returns whether a task will be sent."""
    wanted = next((d for d in decisions if d.field == rules.WORKERS and d.changed), None)
    if wanted is None or not settings.CLOCKQ_SCALE_HOOK:
        return False
    kwargs = {"desired": int(wanted.new), "current": current, "forecast": forecast, "reason": wanted.reason[:2000]}
    transaction.on_commit(lambda: _send(kwargs))
    return True


def scale_out(desired: int, current: int | None, forecast: float | None, reason: str) -> bool:
    """What the `clockq.scale_out` task does at each try: call the hook, unless the desired count
    has changed since the request (a newer request carries the newer count, and a late retry must
    not undo it). Returns whether the hook was called; raises ScaleHookFailed."""
    state = ControlState.objects.filter(pk=ControlState.SINGLETON).first()
    if state is not None and state.desired_workers is not None and state.desired_workers != desired:
        log.info("scale-out to %s dropped: the desired count is now %s", desired, state.desired_workers)
        return False
    if current is None:
        try:
            current = sum(1 for w in heartbeat.live_workers() if w.get("gpu") is not None)
        except redis.RedisError as exc:
            raise ScaleHookFailed(f"cannot count the GPU workers alive (broker: {exc})") from None
    if forecast is None and state is not None:
        forecast = state.forecast
    return call_scale_hook(desired, current, forecast, reason) is not None


def _send(kwargs: dict[str, Any]) -> None:
    from clockq.celery import app

    try:
        app.send_task(
            SCALE_OUT_TASK, kwargs=kwargs, queue=settings.CONTROL_QUEUE, retry=True, retry_policy=_RETRY_POLICY
        )
    except Exception as exc:  # the broker may be down; the next change asks again
        log.warning("could not send the scale-out request (%s GPU workers): %s", kwargs["desired"], exc)
