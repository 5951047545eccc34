"""Which tests CI's PostgreSQL pass runs (.ci/run): the `db_engine` marker, set at collection.

A test is marked when it uses the test database (pytest-django's `db` or `transactional_db`,
through any fixture, such as `start_workers`, `live_server` or a persona, or a `django_db`
marker), unless its file is one of the few below, whose use of the database is the same on every
engine: they read or write a job row the way hundreds of marked tests do, and what they test is
something else (a browser's drawing, a sandbox's walls, a command line's exit codes). Everything
else that touches the database, its ORM queries, transactions, select_for_update, the races
between worker processes, migrations and the hot SQL, runs on both engines. A test that needs
PostgreSQL without using the test database (none today) can carry the marker by hand.

A new test file that uses the database is marked without anyone thinking of it; leaving one out
takes a line here that says why.
"""

from __future__ import annotations

from collections.abc import Iterable

MARKER = "db_engine"

# pytest-django's fixtures that give a test the database; every fixture built on them (personas,
# start_workers, live_server, client logins) pulls one in, and item.fixturenames has the closure.
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"})

# A test file (path from the repository root) or folder (ending in "/") -> why the engine makes no
# difference to what its tests show. tests/test_db_engine.py checks that each one exists.
SAME_ON_EVERY_ENGINE: dict[str, str] = {
    "tests/webapp/test_browser.py": "what Chromium draws from a page; the pages' queries run in tests/webapp",
    "tests/webapp/test_dashboard_browser.py": "the dashboard's drawing in Chromium; its queries: test_dashboard.py",
    "tests/webapp/test_job_form_browser.py": "the submit form in Chromium; the form's rules: test_job_form.py",
    "tests/webapp/test_job_page_browser.py": "the job page in Chromium; its SQL: tests/jobs/test_hot_sql.py",
    "tests/webapp/test_admin_widths.py": "the admin's column widths in Chromium",
    "tests/workers/test_sandbox.py": "the walls bubblewrap puts round a program",
    "tests/workers/test_sandbox_attacks.py": "programs that attack the sandbox",
    "tests/workers/test_program_memory.py": "a program's memory limit, kept by the kernel",
    "tests/workers/test_program_network.py": "a program's own network (slirp4netns)",
    "tests/workloads/test_command.py": "the command protocol (signals, --resume) in a program",
    "tests/workloads/test_keras_train.py": "a Keras workload's training and its checkpoints on disk",
    "tests/clockq_cli/": "the command line as an HTTP client: its output, exit codes and terminal safety",
    "tests/compose/": "the deploy files, and Prometheus scraping a live server's /metrics",
}


def uses_the_database(fixturenames: Iterable[str], markers: Iterable[str]) -> bool:
    """Whether a test with these fixtures (the whole closure) and markers gets the test database."""
    return "django_db" in set(markers) or not DATABASE_FIXTURES.isdisjoint(fixturenames)


def same_on_every_engine(path: str) -> str:
    """Why the tests at `path` (from the repository root) are left out of the PostgreSQL pass; ''
    when they are not."""
    for place, why in SAME_ON_EVERY_ENGINE.items():
        if path == place or (place.endswith("/") and path.startswith(place)):
            return why
    return ""


def depends_on_the_engine(path: str, fixturenames: Iterable[str], markers: Iterable[str]) -> bool:
    """Whether the test belongs in the PostgreSQL pass: it uses the database, and its file is not
    one of those whose use of it is the same on every engine."""
    return uses_the_database(fixturenames, markers) and not same_on_every_engine(path)
