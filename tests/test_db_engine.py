"""The PostgreSQL pass's selection (tests/db_engine.py): every test that uses the database is in it
but for the files named, with a reason, as the same on every engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import db_engine
from tests.harness import ROOT


def test_every_file_left_out_of_the_postgresql_pass_exists_and_says_why():
    for place, why in db_engine.SAME_ON_EVERY_ENGINE.items():
        assert (ROOT / place).exists(), f"{place} is gone: take it out of SAME_ON_EVERY_ENGINE"
        assert why.strip(), place


@pytest.mark.parametrize(
    ("path", "fixtures", "markers", "in_the_pass"),
    [
        ("tests/jobs/test_cancel_race.py", ["transactional_db"], [], True),
        ("tests/jobs/test_hot_sql.py", ["db", "alice"], [], True),
        ("tests/workers/test_crash_recovery.py", ["start_workers", "transactional_db"], [], True),
        ("tests/webapp/test_api.py", ["client"], ["django_db"], True),
        ("tests/policy/test_ordering.py", ["settings"], [], False),
        ("tests/webapp/test_browser.py", ["live_server", "transactional_db"], ["django_db"], False),
        ("tests/clockq_cli/test_cli_live.py", ["clockq", "transactional_db"], [], False),
        ("tests/clockq_cli_other/test_x.py", ["db"], [], True),  # a folder is matched whole, not by prefix
    ],
)
def test_a_test_is_in_the_postgresql_pass_when_it_uses_the_database_where_engines_differ(
    path, fixtures, markers, in_the_pass
):
    assert db_engine.depends_on_the_engine(path, fixtures, markers) is in_the_pass


def test_collection_marks_the_database_tests_and_no_others():
    # Given three files: hot SQL (the database, where engines differ), the pure policy (no
    # database) and a browser test (the database, the same on every engine)
    files = ["tests/jobs/test_hot_sql.py", "tests/policy/test_ordering.py", "tests/webapp/test_browser.py"]
    # When pytest collects them for the PostgreSQL pass
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "db_engine", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    # Then it takes every test of the first and none of the others
    assert run.returncode == 0, run.stdout + run.stderr
    collected = {line.split("::")[0] for line in run.stdout.splitlines() if "::" in line}
    assert collected == {"tests/jobs/test_hot_sql.py"}, run.stdout
