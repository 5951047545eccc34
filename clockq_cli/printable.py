"""Server text made safe for a terminal. A job's name, an error or a reason is someone else's text:
printed raw, ESC ]0;... BEL sets the window's title, ESC [2J clears the screen, ESC ]8;;URL makes a
link, and the bidi overrides reorder what follows. `printable` writes each such character as a
visible escape (`\\x1b`, `\\u202e`) instead, so the operator sees that it was there and the terminal
acts on none of it. Every answer a command shows on the terminal goes through `printable_tree`
(clockq_cli.client), every message on stderr through `printable`; --json needs neither: JSON's
own escapes (`\\u001b`) keep it safe and exact."""

from __future__ import annotations

import re
from typing import Any

# C0 controls and DEL, C1 controls (ESC's one-character form, U+009B CSI, among them), and the
# characters that reorder text: bidi embeddings and overrides, isolates, and the marks.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# Line breaks and tabs are text, not commands: kept where a value may span lines (a traceback).
_LAYOUT = frozenset("\n\t")


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _visible_unless_layout(match: re.Match[str]) -> str:
    return match.group() if match.group() in _LAYOUT else _visible(match)


def printable(text: str, *, lines: bool = True) -> str:
    """`text` with every control and bidi character written as a visible escape; newlines and
    tabs kept when `lines` (a message of one line passes lines=False)."""
    return _UNSAFE.sub(_visible_unless_layout if lines else _visible, text)


def printable_tree(data: Any) -> Any:
    """A JSON value with every string in it, keys included, made `printable`."""
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, dict):
        return {printable_tree(key): printable_tree(value) for key, value in data.items()}
    if isinstance(data, list):
        return [printable_tree(value) for value in data]
    return data
