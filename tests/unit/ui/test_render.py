"""The template helpers: documents pretty-printed, query strings built, autoescape on."""

from __future__ import annotations

from outbox_ui.render import first_line, pretty, query


def test_pretty() -> None:
    assert pretty({"b": 1, "a": "é"}) == '{\n  "a": "é",\n  "b": 1\n}'
    assert pretty('{"x": [1]}') == '{\n  "x": [\n    1\n  ]\n}'
    assert pretty("not json") == "not json"


def test_query_and_first_line() -> None:
    assert query({"queue": "m&x", "type": ""}, page=2) == "queue=m%26x&page=2"
    assert first_line("a\nb") == "a" and first_line(None) == ""
