"""The API's only parser: JSON, bounded in depth, with text that can be stored."""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 32


class BoundedJSONParser(JSONParser):
    """JSON that nests at most MAX_DEPTH deep and whose every string is storable: no lone UTF-16
    surrogate (JSON can spell one, UTF-8 and the database cannot) and no NUL (PostgreSQL refuses
    it). Anything else is a 400 that names the top-level field, before any code echoes the
    text back (a rendered error holding a surrogate would fail in turn)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = json.loads(stream.read())
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error: {str(exc)[:200].encode('utf-8', 'replace').decode()}") from None
        check_json(data)
        return data


def check_json(data: Any) -> None:
    """Raise ParseError for nesting beyond MAX_DEPTH or a string that cannot be stored."""
    # (value, depth, top-level field); iterative, so depth itself cannot overflow the stack.
    stack: list[tuple[Any, int, str | None]] = [(data, 1, None)]
    while stack:
        item, depth, field = stack.pop()
        if isinstance(item, str):
            if not _storable(item):
                where = f"field {field!r}" if field is not None else "the body"
                raise ParseError(f"{where} holds text that cannot be stored (a lone surrogate or NUL)")
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key, value in item.items():
                if not _storable(key):
                    raise ParseError("a field name holds text that cannot be stored (a lone surrogate or NUL)")
                stack.append((value, depth + 1, key if field is None and depth == 1 else field))
        else:
            stack.extend((value, depth + 1, field) for value in item)


def _storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
