"""The streamed title scanner commits only what the final parse would take, however the reply is cut into pieces."""

from __future__ import annotations

import pytest

from orchestrator.planning.title_stream import TitleStream


@pytest.mark.parametrize("text", ['["A1", ["Nested"], "A2"]', '{"items": ["A1", {"x": "Nested"}, "A2"]}'])
def test_a_container_inside_the_items_stops_the_scan_in_one_piece_as_in_many(text):
    whole = TitleStream()
    whole.feed(text)
    pieces = TitleStream()
    for ch in text:
        pieces.feed(ch)
    assert whole.items == pieces.items == ["A1"]
    assert whole.stalled and pieces.stalled
