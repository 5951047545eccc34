"""What every command shares: the API it talks to, the `--json` flag, and where output goes
(tables and JSON to stdout, progress and errors to stderr)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.console import Console

from clockq_cli import config
from clockq_cli.client import Api
from clockq_cli.printable import printable

F = TypeVar("F", bound=Callable[..., Any])


def json_option(command: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of tables.")(command)


def connect(*, exact: bool = False) -> Api:
    """The API at the URL and with the token that the environment or `clockq login` gives. Its
    answers' text is made printable for the terminal, unless `exact` (--json: JSON escapes it)."""
    return Api(config.resolve(os.environ), for_terminal=not exact, max_pages=config.max_pages(os.environ))


def console() -> Console:
    # A job's name or an error is shown as it is: not coloured as if code (highlight), and not
    # read as Rich's markup, where `[link=...]` would make a link and `:smile:` an emoji.
    return Console(highlight=False, markup=False, emoji=False)


def emit_json(data: Any, *, compact: bool = False) -> None:
    click.echo(json.dumps(data, indent=None if compact else 2, sort_keys=False))


def note(message: str) -> None:
    """A line for the operator on stderr: progress, a warning; never mixed into the output. It
    may quote the server, so it is made printable, and one line."""
    click.echo(printable(message, lines=False), err=True)
