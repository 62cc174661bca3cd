"""The one code-fence grammar (orchestrator/book/fences.py): CommonMark's fences, read line by line at the margin."""

from __future__ import annotations

import pytest

from orchestrator.book.fences import close_open_fence, closes, fenced_code, is_fence_line


@pytest.mark.parametrize("line, fence", [
    ("```", True), ("```python", True), ("~~~", True), ("~~~~ js `x`", True), ("   ```py", True),
    ("````text ", True),
    ("``", False), ("~~", False), ("    ```", False), ("\t```", False),  # indented code, not a fence
    ("```x```", False), ("``` `", False),  # a backtick fence's info string holds no backtick: inline code
    ("text ```", False),
])
def test_a_fence_opens_with_three_marks_at_most_three_spaces_in(line, fence):
    assert is_fence_line(line) is fence


@pytest.mark.parametrize("line, mark, closed", [
    ("```", "```", True), ("````", "```", True), ("   ```  \t", "```", True), ("```\r", "```", True),
    ("``", "```", False), ("```", "````", False),  # at least as many
    ("~~~", "```", False), ("```", "~~~", False),  # the same character
    ("```py", "```", False), ("```\xa0", "```", False), ("    ```", "```", False),
])
def test_a_fence_closes_with_the_same_mark_at_least_as_long_and_nothing_after_it(line, mark, closed):
    assert closes(line, mark) is closed


def test_close_open_fence_closes_at_the_opening_indent_and_leaves_closed_text_alone():
    assert close_open_fence("a\n```py\nx = 1") == "a\n```py\nx = 1\n```"
    assert close_open_fence("1. Run:\n\n   ~~~~bash\n   make\n") == "1. Run:\n\n   ~~~~bash\n   make\n   ~~~~"
    assert close_open_fence("a\n```py\nx = 1\n```\nb") == "a\n```py\nx = 1\n```\nb"
    assert close_open_fence("~~~~\n```\n~~~~") == "~~~~\n```\n~~~~"
    assert close_open_fence("inline ```x``` code") == "inline ```x``` code"


def test_fenced_code_reads_every_block_an_unclosed_one_to_the_end():
    text = 'Here:\n```json\n{"items": ["A"]}\n```\n~~~\nB\n~~~\n```\n[1,\n'
    assert fenced_code(text) == ['{"items": ["A"]}', "B", "[1,\n"]
