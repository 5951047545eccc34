"""What a role checks before it starts (clockq/stack/preflight.py, clockq/fleet/marker.py): a
setup that would silently run alone is refused, saying what to change."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from clockq.fleet import marker, registry
from clockq.fleet.models import Host
from clockq.stack import preflight


@pytest.mark.parametrize(
    ("raw", "names", "whole"),
    [
        ("all", set(preflight.ROLES), True),
        ("gpu", {"gpu"}, False),
        (" web, beat ,control", {"web", "beat", "control"}, False),
        ("GPU", {"gpu"}, False),
    ],
)
def test_roles_parse(raw, names, whole):
    roles = preflight.parse_roles(raw)
    assert (set(roles.names), roles.whole) == (names, whole)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "name a role"),
        ("gpus", r"unknown role\(s\) gpus"),
        ("all,gpu", "give it alone"),
        ("web,scheduler", "scheduler"),
    ],
)
def test_bad_roles_are_refused(raw, message):
    with pytest.raises(ValueError, match=message):
        preflight.parse_roles(raw)


ONE = preflight.parse_roles("all")
GPU = preflight.parse_roles("gpu")
FLOWER = preflight.parse_roles("flower")


@pytest.mark.parametrize(
    ("roles", "sqlite", "embedded", "password", "expected"),
    [
        (ONE, True, True, False, []),  # one machine: SQLite and a private broker are the point
        (GPU, True, False, False, ["with SQLite"]),
        (GPU, False, True, False, ["without REDIS_URL"]),
        (GPU, True, True, False, ["with SQLite", "without REDIS_URL"]),
        (GPU, False, False, False, []),
        (FLOWER, False, False, False, ["needs CLOCKQ_ADMIN_PASSWORD"]),
        (FLOWER, False, False, True, []),
    ],
)
def test_setup_problems(roles, sqlite, embedded, password, expected):
    problems = preflight.setup_problems(roles, sqlite=sqlite, embedded_broker=embedded, admin_password_set=password)
    assert len(problems) == len(expected)
    for problem, phrase in zip(problems, expected, strict=True):
        assert phrase in problem


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.4.5", True),
        ("::1", True),
        ("localhost", True),
        (None, True),
        ("198.18.0.1", False),
        ("redis.internal", False),
        ("10.0.0.5", False),
    ],
)
def test_loopback_brokers(host, loopback):
    assert preflight.is_loopback(host) is loopback


def test_a_private_broker_is_refused_only_while_other_hosts_are_live():
    assert preflight.broker_problem(GPU, local_broker=True, broker="127.0.0.1:6379", others=[]) is None
    assert preflight.broker_problem(GPU, local_broker=False, broker="10.0.0.5:6379", others=["b"]) is None
    problem = preflight.broker_problem(GPU, local_broker=True, broker="127.0.0.1:6379", others=["b", "a"])
    assert "host(s) a, b are live" in problem and "loopback (127.0.0.1:6379)" in problem
    assert "its own private Redis" in preflight.broker_problem(ONE, local_broker=True, broker="x", others=["a"])


@pytest.mark.django_db
def test_live_hosts_are_those_seen_lately_besides_this_one():
    now = timezone.now()
    Host.objects.create(name="me", seen_at=now)
    Host.objects.create(name="peer", seen_at=now - timedelta(seconds=5))
    Host.objects.create(name="gone", seen_at=now - timedelta(seconds=registry.LIVE_S + 1))
    assert [h.name for h in registry.live_hosts(besides="me")] == ["peer"]


def test_a_role_on_its_own_without_a_broker_refuses_to_start_saying_why(settings):
    from django.db import connection

    settings.CLOCKQ_EMBEDDED_BROKER = True  # REDIS_URL unset
    with pytest.raises(CommandError) as refused:
        call_command("runstack", "--role", "gpu")
    assert "without REDIS_URL" in str(refused.value)
    assert ("with SQLite" in str(refused.value)) == (connection.vendor == "sqlite")
    with pytest.raises(CommandError, match="unknown role"):
        call_command("runstack", "--role", "gpus")


@pytest.mark.django_db
def test_the_checkpoint_folder_must_hold_the_web_roles_marker(tmp_path):
    shared, local = tmp_path / "shared", tmp_path / "local"
    assert marker.marker_problem(local) is None  # no web role has marked one yet: wait for it

    token = marker.write_marker(shared, "web-host")

    assert marker.marker_problem(shared) is None
    assert marker.write_marker(shared, "web-host-2") == token  # a folder keeps its marker
    missing = marker.marker_problem(local)
    assert "holds no .clockq-shared-folder" in missing and "web-host-2" in missing
    marker.write_marker(local, "elsewhere")  # another web role, with another folder
    assert "another .clockq-shared-folder" in marker.marker_problem(shared)
