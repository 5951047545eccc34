"""The browser for the page tests (test_browser.py, test_dashboard_browser.py)."""

from __future__ import annotations

import os

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: install the Debian package (apt-get install chromium) or run `make test`")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop running in this thread, so Django would refuse
    # every ORM call the test makes ("cannot call this from an async context"). The ORM calls
    # here are plain synchronous ones; allow them, for this module only.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
