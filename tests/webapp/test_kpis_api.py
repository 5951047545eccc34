"""GET /api/kpis: who may read it, its default window, and bad windows refused with a 400 that
names the field. The KPI values themselves are checked against a fixture worked out by hand in
the KPI rollup's tests (test_kpi_rollup.py), and the arithmetic in tests/policy/test_kpis.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from tests.helpers import token_auth

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_alice(alice):
    return token_auth(alice)


def test_no_credentials_is_a_401(client):
    response = client.get("/api/kpis")
    assert response.status_code == 401 and response.json()["detail"]


def test_any_user_may_read_the_cluster_wide_kpis(client, as_alice):
    response = client.get("/api/kpis", **as_alice)

    assert response.status_code == 200
    body = response.json()
    assert set(body["tiers"]) == {"RT", "HP", "SP", "BP", "BK"}
    assert body["overall"]["started"] == 0 and body["overall"]["wait_p95_s"] is None


def test_a_browser_session_works_too(client, alice):
    client.force_login(alice)
    assert client.get("/api/kpis").status_code == 200


def test_the_default_window_is_the_last_hour_in_whole_minutes(client, as_alice):
    before = timezone.now()
    body = client.get("/api/kpis", **as_alice).json()

    since, until = datetime.fromisoformat(body["since"]), datetime.fromisoformat(body["until"])
    assert since.second == 0 and until.second == 0 and body["minutes"] in (60, 61)
    assert since <= before - timedelta(hours=1) < since + timedelta(minutes=1)
    assert until >= before


def test_only_since_ends_the_window_now_and_only_until_starts_it_an_hour_before(client, as_alice):
    body = client.get("/api/kpis", {"until": "2026-12-01T12:00:00Z"}, **as_alice).json()
    assert (body["since"], body["until"]) == ("2026-12-01T11:00:00Z", "2026-12-01T12:00:00Z")

    body = client.get("/api/kpis", {"since": (timezone.now() - timedelta(hours=3)).isoformat()}, **as_alice).json()
    assert body["minutes"] in (180, 181)


@pytest.mark.parametrize(
    ("query", "window"),
    [
        ({"since": "2026-12-01", "until": "2026-12-02"}, ("2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z")),
        # an offset is honoured; no offset means UTC
        ({"since": "2026-12-01T10:00:00+02:00", "until": "2026-12-01T10:00:00"}, ("2026-12-01T08:00:00Z", None)),
        ({"since": "2026-12-01T10:00:30Z", "until": "2026-12-01T10:01:00.5Z"}, ("2026-12-01T10:00:00Z", None)),
    ],
)
def test_dates_and_times_in_iso_8601(client, as_alice, query, window):
    body = client.get("/api/kpis", query, **as_alice).json()
    assert body["since"] == window[0]
    if window[1]:
        assert body["until"] == window[1]


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        ({"since": "2026-12-01T10:00:00Z", "until": "2026-12-01T09:00:00Z"}, "until", "later than since"),
        ({"since": "2026-12-01T10:00:00Z", "until": "2026-12-01T10:00:00Z"}, "until", "later than since"),
        ({"since": "yesterday"}, "since", "ISO 8601"),
        ({"until": "2026-13-01T00:00:00Z"}, "until", "ISO 8601"),  # no such month
        ({"until": "2026-02-30"}, "until", "ISO 8601"),  # no such day
        ({"since": ""}, "since", "ISO 8601"),
        ({"since": "2025-01-01T00:00:00Z", "until": "2026-01-02T00:00:01Z"}, "until", "at most 366 days"),
        ({"since": "1969-12-31T23:59:00Z", "until": "1970-01-01T00:30:00Z"}, "since", "between"),
        ({"until": "9999-12-31T23:59:59Z"}, "until", "between"),
        ({"until": "0001-01-01T00:00:00+01:00"}, "until", "out of range"),  # not convertible to UTC
    ],
)
def test_a_bad_window_is_a_400_naming_the_field(client, as_alice, query, field, says):
    response = client.get("/api/kpis", query, **as_alice)

    assert response.status_code == 400
    body = response.json()
    assert list(body) == [field] and says in body[field][0]


def test_a_window_of_exactly_366_days_is_allowed(client, as_alice):
    since = datetime(2025, 1, 1, tzinfo=UTC)
    query = {"since": since.isoformat(), "until": (since + timedelta(days=366)).isoformat()}
    assert client.get("/api/kpis", query, **as_alice).status_code == 200


def test_the_schema_describes_the_kpis(client):
    import yaml

    document = yaml.safe_load(client.get("/api/schema").content)
    operation = document["paths"]["/api/kpis"]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"since", "until"}
    assert {"200", "400", "401"} <= set(operation["responses"])
