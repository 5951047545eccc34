"""The `clockq` command: a click group of the commands, each in the module named for what it
does. Exit codes and output conventions are in clockq_cli.exits and clockq_cli.output."""

from __future__ import annotations

import os
import sys

import click

from clockq_cli.cmd_cluster import gpus, queues
from clockq_cli.cmd_fleet import drain, hosts, resume
from clockq_cli.cmd_jobs import cancel, jobs, submit
from clockq_cli.cmd_login import login, logout
from clockq_cli.cmd_show import result, show
from clockq_cli.exits import ExitCode

EPILOG = """\b
Exit codes: 0 ok, 1 refused by the server, 2 usage, 3 server unreachable,
4 not logged in or token refused, 5 not found, 6 a job did not succeed (--wait),
7 a download failed its SHA-256 check, 130 interrupted.
The server and token come from CLOCKQ_URL and CLOCKQ_TOKEN, else from `clockq login`."""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Operate a clockq GPU job queue over its HTTP API."""


for command in (login, logout, submit, jobs, show, cancel, result, queues, gpus, hosts, drain, resume):
    cli.add_command(command)


def main() -> None:
    """Run a command; every way out is an exit code of clockq_cli.exits, none a traceback of
    clockq's making (click's own standalone mode would make Ctrl-C exit 1, "refused")."""
    try:
        code = cli.main(prog_name="clockq", standalone_mode=False)
    except click.exceptions.Abort:  # Ctrl-C, or end of input at a prompt
        click.echo("\ninterrupted", err=True)
        code = ExitCode.INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except BrokenPipeError:  # `clockq jobs --json | head -1`: the reader has gone, so has the output
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = ExitCode.REFUSED
    sys.exit(code if isinstance(code, int) else ExitCode.OK)
