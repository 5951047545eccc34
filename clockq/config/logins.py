"""Logins: the authentication backends and the lockout of repeated failed logins (django-axes),
and Flower's own count per username."""

from __future__ import annotations

from datetime import timedelta

from clockq.env import env_int

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses locked-out logins before a password is checked
    "django.contrib.auth.backends.ModelBackend",
]
# Repeated failed logins (the login page, the admin, HTTP basic on the API) lock that username
# from that source for a while. The lock is in the database, so it holds across processes and hosts.
AXES_FAILURE_LIMIT = env_int("CLOCKQ_LOGIN_FAILURE_LIMIT", 5, min_value=1, max_value=1000)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("CLOCKQ_LOGIN_LOCKOUT_MINUTES", 15, min_value=1, max_value=10_000))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A source is the peer's address, but a job's uid for a connection from a job's program on this
# host, so that a job's failures never lock the admin out of the same address (clockq/login_source.py).
AXES_CLIENT_IP_CALLABLE = "clockq.login_source.axes_client_ip"
# Flower also counts failures per username and kind of source (another machine, this host, a
# job), against a guesser spread over many addresses or jobs. 20, four times the per-source limit:
# a user who mistypes from a few places stays far below it, and a spread guesser gets 20 guesses
# a lockout period instead of unbounded ones. A job's failures lock only jobs out.
CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT = env_int(
    "CLOCKQ_FLOWER_USERNAME_FAILURE_LIMIT", 20, min_value=1, max_value=100_000
)
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
