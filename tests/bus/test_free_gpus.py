"""GPUs just freed (clockq/bus/free_gpus.py), read with the queue lengths in one round trip."""

from __future__ import annotations

from clockq.bus import free_gpus, queues
from clockq.bus.client import client
from tests.harness import wait_for


def test_a_gpu_counts_as_free_for_a_while_after_it_left_a_job():
    assert queues.boundary_view().freed == frozenset()
    free_gpus.mark_free(client(), "gpu0@a")
    free_gpus.mark_free(client(), "gpu1@a")
    assert queues.boundary_view().freed == {"gpu0@a", "gpu1@a"}
    # A GPU free for longer than a claim takes is not counted: it takes nothing (its worker died)
    wait_for(lambda: not queues.boundary_view().freed, 10 * free_gpus.FREE_S, what="the marks to age")


def test_the_view_holds_the_queue_lengths_by_rank():
    client().lpush("hp", b"x", b"y")
    client().lpush("bk", b"z")
    assert queues.boundary_view().waiting == [0, 2, 0, 0, 1]
