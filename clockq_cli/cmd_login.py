"""`clockq login URL` and `clockq logout`."""

from __future__ import annotations

import sys

import click

from clockq_cli import answers, config
from clockq_cli.client import Api
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.output import emit_json, json_option, note


@click.command(short_help="Keep a server's URL and your API token.")
@click.argument("url")
@json_option
def login(url: str, as_json: bool) -> None:
    """Keep URL and an API token for the commands that follow.

    The token is asked for without echo, or read from stdin when that is not a terminal
    (`clockq login URL < token-file`); it is never an argument, which `ps` and the shell's
    history would show. It is tried against the server before it is kept, in a file only you
    may read.
    """
    url = config.normal_url(url)
    token = _read_token()
    login = config.Login(url, token)
    Api(login).get("/api/queues", shape=answers.QUEUES)  # a wrong URL or token fails here, and nothing is kept
    path = config.save(login)
    if url.startswith("http://") and not config.is_loopback(url):
        note(f"warning: {url} is plain http: the token crosses the network unencrypted")
    if as_json:
        emit_json({"url": url, "saved_to": str(path)})
    else:
        click.echo(f"Logged in to {url}; the token is kept in {path} (mode 0600).")


def _read_token() -> str:
    # A pipe or a file gives its first line; a terminal gets a prompt that does not echo.
    typed = click.prompt("API token", hide_input=True, err=True) if sys.stdin.isatty() else sys.stdin.readline()
    token = typed.strip()
    if not token:
        raise CliError("no token given: make one on the server's API tokens page (/account/tokens)", ExitCode.USAGE)
    return token


@click.command(short_help="Forget the kept URL and token.")
@json_option
def logout(as_json: bool) -> None:
    """Forget the kept URL and token (the token itself stays valid until revoked on the server)."""
    path = config.forget()
    if as_json:
        emit_json({"removed": str(path) if path else None})
    else:
        click.echo(f"Removed {path}." if path else "Not logged in: there was nothing to remove.")
