"""Headless Chromium (the Debian package) for the browser tests, driven by Playwright; no browser
is ever downloaded. The `browser` fixture is in tests/webapp/conftest.py."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium phones home, and this closed network refuses it.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 10_000  # fail fast: every page here is local


def log_in(page, path: str, username: str, password: str) -> None:
    page.goto(path)
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()
