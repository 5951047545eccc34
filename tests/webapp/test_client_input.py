"""client_input: the reader and check every client's input passes (the API's bodies, the form's posts)."""

from __future__ import annotations

import pytest

from webapp.client_input import InputRefused, check, loads, object_from_pairs

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"params": ' + "[" * 40 + "]" * 40 + "}", None),  # deep, but within what json itself reads
        ('{"params": ' + DEEP + "}", None),  # beyond it: json gives up with the stack
        ('{"name": "a\\"b: {[", "params": ' + DEEP + "}", None),  # brackets in a string are text
        (DEEP, "params"),  # one field's text: the field is known
    ],
)
def test_too_deep_names_the_field(raw, field):
    with pytest.raises(InputRefused, match="field 'params' is nested deeper than 32 levels") as refused:
        loads(raw, field=field)
    assert refused.value.field == "params"


def test_a_batch_too_deep_is_said_of_the_body():
    with pytest.raises(InputRefused, match=r"^the body is nested deeper"):
        loads("[" + DEEP + "]")


def test_depth_counts_the_submission_around_a_field():
    assert loads("[" * 31 + "]" * 31, field="params") is not None
    with pytest.raises(InputRefused, match="nested deeper"):
        loads("[" * 32 + "]" * 32, field="params")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"name": "\xff"}', "field 'name' holds text that cannot be stored (invalid UTF-8"),
        (b'{"name": "\\ud800"}', "field 'name' holds text that cannot be stored"),
        (b'{"name": "a\\u0000"}', "field 'name' holds text that cannot be stored"),
        (b'{"\\ud800": 1}', "the body has a field name that holds text that cannot be stored"),
        (b'{"params": {"a": {"\\udfff": 1}}}', "field 'params' has a key that holds text"),
        (b'{"tier": "HP", "tier": "RT"}', "field 'tier' is given more than once"),
        (b'{"params": [{"a": 1, "a": 2}]}', "field 'params' holds the key 'a' more than once"),
        (b'{"\\ud800": 1, "\\ud800": 2}', "field '\\ud800' is given more than once"),  # shown escaped
        (b'{"name": ', "the body is not valid JSON"),
    ],
)
def test_refusals_name_the_field_and_say_why(raw, message):
    with pytest.raises(InputRefused) as refused:
        loads(raw)
    assert str(refused.value).startswith(message)
    str(refused.value).encode("utf-8")  # the message itself can always be shown


def test_valid_input_reads_as_json_does():
    assert loads('\ufeff{"name": "résumé \ufffd", "params": {"a": [1, {"b": null}]}}'.encode()) == {
        "name": "résumé \ufffd",
        "params": {"a": [1, {"b": None}]},
    }


def test_form_fields_get_the_same_check():
    with pytest.raises(InputRefused, match="field 'tier' is given more than once"):
        check(object_from_pairs([("name", "n"), ("tier", "HP"), ("tier", "RT")]))
    check(object_from_pairs([("name", "n"), ("tier", "HP")]))


def test_the_field_finder_reads_strings_as_text():
    """Quotes escaped and brackets inside a string do not count; the field after it is named."""
    with pytest.raises(InputRefused, match=r"^field 'params' is nested deeper"):
        loads('{"a": "' + '\\"[{:' * 50_000 + '", "params": ' + DEEP + "}")
