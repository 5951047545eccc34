"""`clockq queues` and `clockq gpus`: the cluster as the API sees it."""

from __future__ import annotations

import click

from clockq_cli import answers, render
from clockq_cli.output import connect, console, emit_json, json_option


@click.command()
@json_option
def queues(as_json: bool) -> None:
    """Jobs waiting, running and held in each tier, and the live workers."""
    answer = connect(exact=as_json).get("/api/queues", shape=answers.QUEUES)
    if as_json:
        emit_json(answer)
    else:
        console().print(render.queues_tables(answer))


@click.command()
@json_option
def gpus(as_json: bool) -> None:
    """The latest telemetry sample of every GPU in the cluster."""
    answer = connect(exact=as_json).get("/api/gpus", shape=answers.GPUS)
    if as_json:
        emit_json(answer)
    else:
        console().print(render.gpus_table(answer))
