"""Worker names held by one launcher at a time (clockq/bus/names.py), on a real Redis."""

from __future__ import annotations

import threading

import pytest

from clockq.bus import names
from clockq.bus.client import client


@pytest.fixture
def short_ttl(monkeypatch):
    monkeypatch.setattr(names, "TTL_S", 2)
    monkeypatch.setattr(names, "RENEW_EVERY_S", 0.5)


def test_a_free_name_is_taken_and_renewed_by_its_holder_only():
    me, other = names.new_instance(), names.new_instance()
    names.claim(client(), ["gpu0@node7"], me)
    assert names.renew(client(), "gpu0@node7", me)
    assert not names.renew(client(), "gpu0@node7", other)
    names.release(client(), ["gpu0@node7"], other)  # not its name: nothing happens
    assert client().exists(names.KEY_PREFIX + "gpu0@node7")
    names.release(client(), ["gpu0@node7"], me)
    assert not client().exists(names.KEY_PREFIX + "gpu0@node7")


def test_a_name_whose_holder_renews_it_is_refused_saying_where_it_runs(short_ttl):
    holder = names.Keeper(client, ["gpu0@twin"], names.new_instance())
    names.claim(client(), ["gpu0@twin"], holder.instance)
    holder.start()
    try:
        with pytest.raises(names.NameTaken, match="gpu0@twin is held by a live worker: a launcher on machine"):
            names.claim(client(), ["gpu0@twin"], names.new_instance(), poll_s=0.05)
    finally:
        holder.stop()


def test_a_name_whose_holder_died_is_taken_once_it_expires(short_ttl):
    dead = names.new_instance()
    names.claim(client(), ["gpu0@phoenix"], dead)  # and nobody renews it
    waited = threading.Event()
    me = names.new_instance()

    names.claim(client(), ["gpu0@phoenix"], me, on_wait=lambda name, holder: waited.set(), poll_s=0.05)

    assert waited.is_set()
    assert client().get(names.KEY_PREFIX + "gpu0@phoenix").decode() == me
