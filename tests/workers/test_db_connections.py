"""GPU workers keep their database connection from one task to the next (a reconnect per slice
switch was a tenth of it), and a connection the database dropped costs a reconnect, not a job."""

from __future__ import annotations

import pytest
from django.db import connection

from clockq.jobs.models import Job
from tests.helpers import submit, wait_finished

pytestmark = pytest.mark.integration


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: its server can drop a connection")
def test_a_worker_whose_kept_connection_the_database_dropped_reconnects(start_workers, alice):
    start_workers(gpus=1)
    first = submit(alice, "SP", "first", steps=3)
    wait_finished(first, timeout=60)  # the worker's pool child now holds a connection

    with connection.cursor() as cursor:  # as a database restart or an idle timeout would
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    third = submit(alice, "SP", "after-the-drop", steps=3)
    (third,) = wait_finished(third, timeout=30)  # well inside the reconciler's grace period
    assert third.state == "succeeded"
    assert Job.objects.get(pk=third.pk).failures == 0
