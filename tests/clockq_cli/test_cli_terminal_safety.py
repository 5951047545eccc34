"""What the server says cannot steer the operator's terminal: `clockq` against a live server whose
jobs are named, and fail, with escape sequences. Every output mode prints them as visible text,
with no ESC byte; --json keeps them exact, as JSON's own escapes."""

from __future__ import annotations

import json

import pytest

from clockq.jobs.models import Job
from tests.helpers import submit

pytestmark = pytest.mark.django_db(transaction=True)

TITLE = "\x1b]0;pwned\x07"  # OSC 0: sets the window's title
CLEAR = "\x1b[2J"  # CSI 2J: clears the screen
LINK = "\x1b]8;;http://x\x1b\\click\x1b]8;;\x1b\\"  # OSC 8: a hyperlink
CSI = "\x9b31m"  # the one-byte C1 form of ESC [
RTL = "\u202egnp.exe"  # a right-to-left override: shows as exe.png
RICH_LINK = "[link=http://x]rich[/link]"  # Rich's own markup for a hyperlink
NAME = f"train{TITLE}{CLEAR}{LINK}{CSI}{RTL}{RICH_LINK}"
ERROR = f'Traceback (most recent call last):\n  File "x.py"\nValueError: bad{TITLE}{CLEAR}{LINK}\r'


def no_control_bytes(text: str) -> None:
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text and "\r" not in text, repr(text)
    assert "\u202e" not in text, repr(text)


@pytest.fixture
def hostile_job(alice):
    """A job of alice's that failed, whose name and error hold escape sequences."""
    job = submit(alice, "SP", name=NAME)
    Job.objects.filter(pk=job.pk).update(state="failed", last_error=ERROR)
    return job


def test_jobs_and_show_print_escape_sequences_as_visible_text(clockq, clockq_as_carol, hostile_job):
    # When alice lists her jobs, and she and carol (staff: the whole traceback) show the job
    listed = clockq("jobs", "--all")
    shown = clockq("show", str(hostile_job.pk))
    shown_to_staff = clockq_as_carol("show", str(hostile_job.pk))

    # Then each prints the name and error with no ESC, BEL, C1, CR or bidi override in it, but
    # with each written out, so that the operator sees it was there
    for done in (listed, shown, shown_to_staff):
        assert done.code == 0, done.err
        no_control_bytes(done.out + done.err)
        assert "\\x1b]0;pwned\\x07" in done.out and "\\x1b[2J" in done.out and "\\u202e" in done.out
        assert RICH_LINK in done.out  # Rich's markup printed as it is, not made a link
    assert "ValueError: bad\\x1b]0;pwned" in shown.out
    # And the staff view keeps the traceback's lines as lines
    assert 'File "x.py"\nValueError: bad\\x1b' in shown_to_staff.out


def test_json_output_keeps_the_text_exact_in_json_escapes(clockq, hostile_job):
    for args in (["jobs", "--all", "--json"], ["show", str(hostile_job.pk), "--json"]):
        done = clockq(*args)
        assert done.code == 0, done.err
        no_control_bytes(done.out)
        body = json.loads(done.out)
        job = body["jobs"][0] if "jobs" in body else body["job"]
        assert job["name"] == NAME and job["last_error"].startswith("ValueError: bad\x1b]0;pwned")


def test_cancel_and_errors_on_stderr_print_the_name_as_visible_text(clockq, alice):
    # Given a queued job of alice's with escape sequences in its name
    job = submit(alice, "SP", name=NAME)

    # When she cancels it, and then cancels it again (a refusal, on stderr)
    first = clockq("cancel", str(job.pk))
    again = clockq("cancel", str(job.pk))

    # Then both lines name the job with nothing a terminal would act on
    assert first.code == 0 and again.code == 1, again.err
    no_control_bytes(first.out + first.err + again.out + again.err)
    assert "\\x1b]0;pwned" in first.out
