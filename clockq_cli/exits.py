"""The exit codes, one per kind of failure a script may want to tell apart, and the error that
carries one. Every failure ends in one line on stderr, never a traceback."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import click

from clockq_cli.printable import printable

# A message quotes the server (an error's detail, a job's name): one line, and not a flood.
MAX_MESSAGE_CHARS = 1000


class ExitCode(IntEnum):
    OK = 0
    REFUSED = 1  # the server refused or failed the request (400, 409, 429, 5xx), or is not clockq
    USAGE = 2  # a bad command line or job file (click's own code for a usage error)
    UNREACHABLE = 3  # no answer: connection refused, unknown host, timeout, TLS failure
    AUTH = 4  # not logged in, a token refused (401), or not allowed (403)
    NOT_FOUND = 5  # no such job, result or file (or not one of yours)
    JOB_FAILED = 6  # --wait: a job ended failed, cancelled or timed out
    CHECKSUM = 7  # a downloaded file's SHA-256 or size is not the one the API gave
    INTERRUPTED = 130  # Ctrl-C while waiting; the jobs go on


class CliError(click.ClickException):
    """A failure to report in one line and exit with `code`; `body` is the API's error answer,
    when there was one. The message is made printable and one line, cut at MAX_MESSAGE_CHARS."""

    def __init__(self, message: str, code: ExitCode = ExitCode.REFUSED, *, body: Any = None):
        line = printable(message, lines=False)
        if len(line) > MAX_MESSAGE_CHARS:
            line = line[: MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(line)
        self.exit_code = int(code)  # type: ignore[misc]  # click reads it from the instance too
        self.body = body
