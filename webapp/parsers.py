"""The API's only parser: JSON, read and checked as every client's input is (webapp/client_input.py)."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from webapp import client_input


class BoundedJSONParser(JSONParser):
    """UTF-8 JSON that nests at most client_input.MAX_DEPTH deep, names no key twice and holds
    only storable text; anything else is a 400 naming the top-level field, before any code
    echoes the text back. The web form's posts pass the same checks (webapp.forms.posted_fields)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return client_input.loads(stream.read())
        except client_input.InputRefused as exc:
            raise ParseError(str(exc)) from None
