"""One way to write dates, durations, params and errors on the pages (webapp/templatetags/clockq_format.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.utils import timezone

from webapp.templatetags.clockq_format import duration, error_line, pretty_json, when


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (0.42, "0.4 ms"),
        (3.04, "3 ms"),
        (250, "250 ms"),
        (999.4, "999 ms"),
        (999.6, "1 s"),
        (1000, "1 s"),
        (1500, "1.5 s"),
        (12_300, "12 s"),
        (59_600, "1 min"),
        (60_000, "1 min"),
        (90_000, "1 min 30 s"),
        (599_000, "9 min 59 s"),
        (754_000, "13 min"),
        (3_600_000, "1 h"),
        (7_500_000, "2 h 5 min"),
        (86_400_000, "1 d"),
        (90_000_000, "1 d 1 h"),
        (-1500, "-1.5 s"),
        (None, ""),
    ],
)
def test_durations_read_as_a_person_would_say_them(ms, text):
    assert duration(ms) == text


def test_an_instant_is_iso_like_in_the_server_zone_and_marked_for_the_browser(settings):
    instant = datetime(2026, 12, 2, 19, 9, 56, 123456, tzinfo=UTC)
    assert str(when(instant)) == (
        '<time datetime="2026-12-02T19:09:56.123+00:00" data-precision="s" title="UTC">2026-12-02 19:09:56</time>'
    )
    assert ">2026-12-02 19:09:56.123</time>" in str(when(instant, "ms"))
    with timezone.override("Asia/Tokyo"):
        assert '+09:00" data-precision="s" title="Asia/Tokyo">2026-12-03 04:09:56</time>' in str(when(instant))
    assert when(None) == ""


def test_params_are_json_on_one_line_or_indented_when_long():
    assert pretty_json({"steps": 10, "name": "café"}) == '{"steps": 10, "name": "café"}'
    long = {"argv": ["python", "-c", "print('a fairly long program line that does not fit')"], "timeout_s": 60}
    text = pretty_json(long)
    assert text.startswith('{\n  "argv": [\n') and json.loads(text) == long


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            'Traceback (most recent call last):\n  File "/srv/clockq/workers/run/steps.py", line 88, in run\n'
            "    raise RuntimeError(msg)\nRuntimeError: injected failure at step 3\n",
            "RuntimeError: injected failure at step 3",
        ),
        (
            "Traceback (most recent call last):\n  ...\nFileNotFoundError: [Errno 2] No such file or directory: "
            "'/var/lib/clockq/ckpt/12/gen-3.ckpt'",
            "FileNotFoundError: [Errno 2] No such file or directory: '…/gen-3.ckpt'",
        ),
        ("over the limit of 5 MB of checkpoints (1/2 used)", "over the limit of 5 MB of checkpoints (1/2 used)"),
        ("", ""),
    ],
)
def test_an_error_is_its_last_line_without_server_paths(error, line):
    assert error_line(error) == line


def test_a_very_long_error_line_is_cut_with_an_ellipsis():
    line = error_line("ValueError: " + "x" * 1000)
    assert len(line) == 300 and line.endswith("…")
