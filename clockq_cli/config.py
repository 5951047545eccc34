"""Where the CLI finds its server and token: CLOCKQ_URL and CLOCKQ_TOKEN, else the file that
`clockq login` wrote (`login.json` in the user's config folder, ~/.config/clockq on Linux),
readable by its owner only."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click

from clockq_cli.exits import CliError, ExitCode

URL_ENV = "CLOCKQ_URL"
TOKEN_ENV = "CLOCKQ_TOKEN"
FILE_NAME = "login.json"
MAX_PAGES_ENV = "CLOCKQ_MAX_PAGES"
# The most pages of a list one command reads (clockq_cli.client.Api.pages): 10,000 jobs at the
# API's 50 a page, more than a terminal shows, and a bound on a server whose pages never end.
DEFAULT_MAX_PAGES = 200
MAX_PAGES_RANGE = range(1, 100_001)


@dataclass(frozen=True)
class Login:
    url: str
    token: str


def login_path() -> Path:
    """~/.config/clockq/login.json on Linux ($XDG_CONFIG_HOME honoured), the platform's own
    folder elsewhere."""
    return Path(click.get_app_dir("clockq")) / FILE_NAME


def normal_url(url: str) -> str:
    """The server's base URL without a trailing slash; a usage error unless it is http(s) with a host."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"the server URL must look like https://host[:port], not {url[:80]!r}", ExitCode.USAGE)
    if parts.query or parts.fragment:
        raise CliError(f"the server URL takes no query or fragment: {url[:80]!r}", ExitCode.USAGE)
    return url


def is_loopback(url: str) -> bool:
    return urlsplit(url).hostname in ("localhost", "127.0.0.1", "::1")


def resolve(environ: Mapping[str, str] = os.environ) -> Login:
    """The URL and token to use: each from the environment when set there, else from the login
    file. The file's token goes only to the file's own URL: with CLOCKQ_URL naming another
    server, the token must come from CLOCKQ_TOKEN too."""
    saved = read_saved()
    url = environ.get(URL_ENV, "").strip() or (saved.url if saved else "")
    if not url:
        raise CliError(f"not logged in: run `clockq login URL`, or set {URL_ENV} and {TOKEN_ENV}", ExitCode.AUTH)
    url = normal_url(url)
    token = environ.get(TOKEN_ENV, "").strip()
    if not token and saved is not None and saved.url == url:
        token = saved.token
    if not token:
        raise CliError(f"no token for {url}: run `clockq login {url}`, or set {TOKEN_ENV}", ExitCode.AUTH)
    return Login(url, token)


def max_pages(environ: Mapping[str, str] = os.environ) -> int:
    """CLOCKQ_MAX_PAGES, or DEFAULT_MAX_PAGES when it is not set; a usage error when it is not a
    whole number in MAX_PAGES_RANGE."""
    raw = environ.get(MAX_PAGES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_PAGES
    if not (raw.isascii() and raw.isdigit()) or int(raw) not in MAX_PAGES_RANGE:
        raise CliError(
            f"{MAX_PAGES_ENV} must be a whole number from {MAX_PAGES_RANGE.start} to {MAX_PAGES_RANGE.stop - 1}, "
            f"not {raw[:40]!r}",
            ExitCode.USAGE,
        )
    return int(raw)


def read_saved() -> Login | None:
    path = login_path()
    try:
        mode = path.stat().st_mode
        raw = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", ExitCode.USAGE) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        click.echo(f"warning: others may read your token in {path}; run `chmod 600 {path}`", err=True)
    try:
        data = json.loads(raw)
        return Login(normal_url(data["url"]), str(data["token"]))
    except (ValueError, KeyError, TypeError, CliError):
        raise CliError(
            f"{path} is not a login file clockq wrote; run `clockq login URL` again", ExitCode.USAGE
        ) from None


def save(login: Login) -> Path:
    """Write the login file readable by its owner only (0600, in a 0700 folder), replaced in one
    step so that a crash leaves the old file or the new one, never half of either."""
    path = login_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".login-", dir=path.parent)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "w") as out:
            json.dump({"url": login.url, "token": login.token}, out)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def forget() -> Path | None:
    """Remove the login file; its path, or None when there was none."""
    path = login_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path
