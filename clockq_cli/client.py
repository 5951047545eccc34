"""clockq's HTTP API with a token. Every failure becomes a CliError with its exit code and one
line that says what happened and where: no traceback reaches the operator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import requests

from clockq_cli.config import Login
from clockq_cli.exits import CliError, ExitCode

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
PAGE_SIZE = 50  # the API's page (REST_FRAMEWORK's PAGE_SIZE)


class Api:
    """One server, one token. `what` names the thing a call looks up ("job 7"): a 404 says that
    it is not found (the API answers another user's job as it does a missing one)."""

    def __init__(self, login: Login, *, session: requests.Session | None = None):
        self.url = login.url
        self.session = session or requests.Session()
        self.session.headers.update(
            {"Authorization": f"Token {login.token}", "Accept": "application/json", "User-Agent": "clockq-cli"}
        )

    def get(self, path: str, *, params: dict[str, Any] | None = None, what: str = "") -> Any:
        return self._json(self._send("GET", path, params=params), what)

    def post(self, path: str, body: Any = None, *, what: str = "") -> Any:
        return self._json(self._send("POST", path, json=body), what)

    def pages(self, path: str, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `limit` results of a paged list, newest first, and how many there are in all."""
        found: list[dict[str, Any]] = []
        page, total = 1, 0
        while len(found) < limit:
            answer = self.get(path, params={**params, "page": page})
            total = answer["count"]
            found.extend(answer["results"])
            if not answer.get("next"):
                break
            page += 1
        return found[:limit], total

    @contextlib.contextmanager
    def download(self, path: str, *, what: str = "") -> Iterator[requests.Response]:
        """A streamed GET of a file; the caller reads `iter_content()` within the block."""
        response = self._send("GET", path, stream=True)
        try:
            if response.status_code != 200:
                self._json(response, what)  # raises, saying why
            yield response
        except requests.RequestException as exc:
            raise CliError(f"{self.url}: the download broke off ({type(exc).__name__})", ExitCode.UNREACHABLE) from None
        finally:
            response.close()

    def job_path(self, job_id: int, *rest: str) -> str:
        return "/".join([f"/api/jobs/{job_id}", *(quote(part, safe="") for part in rest)])

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            return self.session.request(
                method, self.url + path, timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), allow_redirects=False, **kwargs
            )
        except requests.exceptions.SSLError as exc:
            raise CliError(f"cannot reach {self.url}: TLS failed ({_reason(exc)})", ExitCode.UNREACHABLE) from None
        except requests.Timeout:
            raise CliError(f"cannot reach {self.url}: no answer in time", ExitCode.UNREACHABLE) from None
        except requests.ConnectionError as exc:
            raise CliError(f"cannot reach {self.url}: {_reason(exc)}", ExitCode.UNREACHABLE) from None
        except requests.RequestException as exc:
            raise CliError(f"{method} {self.url}{path}: {type(exc).__name__}", ExitCode.UNREACHABLE) from None

    def _json(self, response: requests.Response, what: str) -> Any:
        try:
            body = response.json()
        except ValueError:
            body = None
        status = response.status_code
        if 200 <= status < 300 and body is not None:
            return body
        if 300 <= status < 400:
            where = response.headers.get("location", "elsewhere")
            raise CliError(f"{self.url} redirects to {where[:120]}: use that URL", ExitCode.REFUSED)
        if body is None:
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            raise CliError(
                f"{self.url} did not answer as clockq's API does (HTTP {status}, {kind}): is the URL right?",
                ExitCode.REFUSED,
            )
        detail = describe_refusal(body)
        if status == 401:
            raise CliError(
                f"{self.url} refused the token (wrong, revoked or expired): `clockq login {self.url}` with a new one",
                ExitCode.AUTH,
            )
        if status == 403:
            raise CliError(f"not allowed: {detail}", ExitCode.AUTH)
        if status == 404:
            raise CliError(f"{what} not found, or not yours" if what else detail, ExitCode.NOT_FOUND)
        prefix = f"{what}: " if what else ""
        raise CliError(f"{prefix}refused (HTTP {status}): {detail}", ExitCode.REFUSED, body=body)


def describe_refusal(body: Any, *, labels: dict[str, str] | None = None) -> str:
    """The API's error body in words: `detail`, then each field's problems; a batch's entries by
    their index, or the label given for it (`labels`)."""
    if not isinstance(body, dict):
        return str(body)[:300]
    parts = [str(body["detail"])] if "detail" in body else []
    for field, problems in body.items():
        if field == "detail":
            continue
        if field == "errors" and isinstance(problems, dict):
            for index, entry in problems.items():
                label = (labels or {}).get(str(index), f"entry {index}")
                parts.append(f"{label}: {describe_refusal(entry)}")
            continue
        parts.append(f"{field}: {'; '.join(_messages(problems))}")
    return " | ".join(parts) if parts else "no reason given"


def _messages(problems: Any) -> list[str]:
    if isinstance(problems, list):
        return [m for p in problems for m in _messages(p)]
    if isinstance(problems, dict):
        return [str(problems["message"])] if "message" in problems else [describe_refusal(problems)]
    return [str(problems)]


def _reason(exc: Exception) -> str:
    """The innermost cause of a connection failure in a few words ("Connection refused")."""
    text = str(exc)
    for marker in ("] ", "Errno"):
        if marker in text:
            text = text.rsplit(marker, 1)[-1]
    return text.strip(" ')\"")[:120] or type(exc).__name__
