"""clockq's HTTP API with a token. Every failure becomes a CliError with its exit code and one
line that says what happened and where: no traceback reaches the operator, whatever the server
answers. An answer is read up to MAX_ANSWER_BYTES, must be JSON of the shape the command expects
(clockq_cli.answers), and a paged list is read a bounded number of pages (`pages`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import requests

from clockq_cli import answers
from clockq_cli.config import DEFAULT_MAX_PAGES, MAX_PAGES_ENV, Login
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.printable import printable_tree

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
PAGE_SIZE = 50  # the API's page (REST_FRAMEWORK's PAGE_SIZE)
# The API's largest answers are a job with its history (500 slices and 500 events at most) and a
# page of 50 jobs: well under 1 MiB. Sixteen times that and more is not clockq talking.
MAX_ANSWER_BYTES = 16 << 20
CHUNK_BYTES = 64 << 10


class Api:
    """One server, one token. `what` names the thing a call looks up ("job 7"): a 404 says that
    it is not found (the API answers another user's job as it does a missing one). Each call
    names the `shape` its answer must have. With `for_terminal`, every string of an answer is
    made printable (clockq_cli.printable) before a command sees it; --json asks for the answer
    exactly as it came."""

    def __init__(
        self,
        login: Login,
        *,
        for_terminal: bool = True,
        max_pages: int = DEFAULT_MAX_PAGES,
        session: requests.Session | None = None,
    ):
        self.url = login.url
        self.for_terminal = for_terminal
        self.max_pages = max_pages
        self.session = session or requests.Session()
        self.session.headers.update(
            {"Authorization": f"Token {login.token}", "Accept": "application/json", "User-Agent": "clockq-cli"}
        )

    def get(self, path: str, *, shape: answers.Shape, params: dict[str, Any] | None = None, what: str = "") -> Any:
        return self._answer(self._send("GET", path, params=params), path, shape, what)

    def post(self, path: str, body: Any = None, *, shape: answers.Shape, what: str = "") -> Any:
        return self._answer(self._send("POST", path, json=body), path, shape, what)

    def pages(self, path: str, params: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Each page of a paged list of jobs in turn, newest first, read while the caller asks.

        The CLI asks for page 1, 2, ... at its own URL: it never follows a `next` link (its
        token goes to no other host, whatever the link says), it only reads one as "more
        follow". A server whose pages never end is stopped: a `next` seen before, or a page that
        lists no job not listed before, is a loop; and at most `max_pages` pages are read
        (CLOCKQ_MAX_PAGES)."""
        seen_next: set[str] = set()
        seen_ids: set[int] = set()
        for number in range(1, self.max_pages + 1):
            page = self.get(path, params={**params, "page": number}, shape=answers.JOB_PAGE)
            yield page
            link = page.get("next")
            if not link:
                return
            ids = {job["id"] for job in page["results"]}
            if link in seen_next or not ids - seen_ids:
                raise CliError(
                    f"{self.url}{path}: page {number} says more follow, but its pages loop "
                    f"({'the same next link again' if link in seen_next else 'no job not listed before'})",
                    ExitCode.REFUSED,
                )
            seen_next.add(link)
            seen_ids |= ids
        raise CliError(
            f"{self.url}{path}: more than {self.max_pages} pages; the CLI reads at most {self.max_pages} "
            f"({MAX_PAGES_ENV} raises it; --limit asks for fewer jobs)",
            ExitCode.REFUSED,
        )

    def listing(self, path: str, params: dict[str, Any], limit: int) -> tuple[list[dict[str, Any]], int]:
        """Up to `limit` results of a paged list, newest first, and how many there are in all."""
        found: list[dict[str, Any]] = []
        total = 0
        for page in self.pages(path, params):
            total = page["count"]
            found.extend(page["results"])
            if len(found) >= limit:
                break
        return found[:limit], total

    @contextlib.contextmanager
    def download(self, path: str, *, what: str = "") -> Iterator[requests.Response]:
        """A streamed GET of a file; the caller reads `iter_content()` within the block."""
        response = self._send("GET", path)
        try:
            if response.status_code != 200:
                self._answer(response, path, answers.ANY, what)  # raises, saying why, for an error
                raise CliError(f"{self.url}{path}: HTTP {response.status_code} where a file was expected")
            yield response
        except requests.RequestException as exc:
            raise CliError(f"{self.url}: the download broke off ({type(exc).__name__})", ExitCode.UNREACHABLE) from None
        finally:
            response.close()

    def job_path(self, job_id: int, *rest: str) -> str:
        return "/".join([f"/api/jobs/{job_id}", *(quote(part, safe="") for part in rest)])

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            # Streamed: the body is read by _body, up to MAX_ANSWER_BYTES, or by a download.
            return self.session.request(
                method,
                self.url + path,
                timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
                allow_redirects=False,
                stream=True,
                **kwargs,
            )
        except requests.exceptions.SSLError as exc:
            raise CliError(f"cannot reach {self.url}: TLS failed ({_reason(exc)})", ExitCode.UNREACHABLE) from None
        except requests.Timeout:
            raise CliError(f"cannot reach {self.url}: no answer in time", ExitCode.UNREACHABLE) from None
        except requests.ConnectionError as exc:
            raise CliError(f"cannot reach {self.url}: {_reason(exc)}", ExitCode.UNREACHABLE) from None
        except requests.RequestException as exc:
            raise CliError(f"{method} {self.url}{path}: {type(exc).__name__}", ExitCode.UNREACHABLE) from None

    def _body(self, response: requests.Response, path: str) -> bytes:
        """The whole body, refused past MAX_ANSWER_BYTES (as it is declared or as it comes)."""
        too_big = CliError(
            f"{self.url}{path}: the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB, more than any "
            "answer of clockq's API: not read",
            ExitCode.REFUSED,
        )
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            response.close()
            raise too_big
        body = bytearray()
        try:
            for chunk in response.iter_content(CHUNK_BYTES):
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise too_big
        except requests.RequestException as exc:
            broke = f"{self.url}{path}: the answer broke off ({type(exc).__name__})"
            raise CliError(broke, ExitCode.UNREACHABLE) from None
        finally:
            response.close()
        return bytes(body)

    def _answer(self, response: requests.Response, path: str, shape: answers.Shape, what: str) -> Any:
        body = _parse(self._body(response, path))
        status = response.status_code
        if 200 <= status < 300 and body is not None:
            try:
                answers.check(body, shape)
            except answers.Malformed as exc:
                wrong = f"{self.url}{path} did not answer as clockq's API does: {exc}"
                raise CliError(wrong, ExitCode.REFUSED) from None
            return printable_tree(body) if self.for_terminal else body
        if 300 <= status < 400:
            where = response.headers.get("location", "elsewhere")
            raise CliError(f"{self.url} redirects to {where[:120]}: use that URL", ExitCode.REFUSED)
        if body is None:
            kind = response.headers.get("content-type", "no content type").split(";")[0]
            raise CliError(
                f"{self.url} did not answer as clockq's API does (HTTP {status}, {kind}): is the URL right?",
                ExitCode.REFUSED,
            )
        try:
            detail = describe_refusal(body)
        except RecursionError:
            detail = "an error too deeply nested to read"
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


def _parse(raw: bytes) -> Any:
    """The body as JSON, or None when it is not JSON (or nests past what Python can read)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


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
