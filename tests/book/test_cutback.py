"""cutback: a section the token cap stopped, cut back to its last complete sentence, item, row or code block.

(The simulator's published take cut back as a whole: tests/book/test_checks.py.)
"""

from __future__ import annotations

import pytest

from orchestrator.book.cutback import cut_back


@pytest.mark.parametrize(("text", "expected"), [
    ("First sentence. Second sent", "First sentence."),
    ("Does it work? It does! And th", "Does it work? It does!"),
    ('He said "stop." Then he wal', 'He said "stop."'),
    ("It works. Use a store, e.g. Redis, for sess", "It works."),  # "e.g." is no sentence end
    ("Python 3.12 is out. Version 3.13 adds a", "Python 3.12 is out."),  # nor is a decimal point
    ("Intro:\n\n- one\n- two\n- thr", "Intro:\n\n- one\n- two"),  # complete list items are kept
    ("Points:\n\n- **A**: Done. And th", "Points:\n\n- **A**: Done."),
    ("Steps:\n\n1. Install it.\n2. Run it", "Steps:\n\n1. Install it."),
    ("Para.\n\n### Next\n\nPartial text", "Para."),  # a heading with nothing under it goes
    ("| a | b |\n|---|---|\n| 1 | 2 |\n| 3 |", "| a | b |\n|---|---|\n| 1 | 2 |"),
    ("Text.\n\n```py\nx = 1\n```\n\nAfter th", "Text.\n\n```py\nx = 1\n```"),
    ("All good.\n", "All good."),
])
def test_cut_back(text, expected):
    assert cut_back(text) == expected


def test_cut_back_inside_code_keeps_code_that_stands_alone():
    text = "Para.\n\nExample:\n\n```python\nx = 1\ny = x + 1\nprint(y, fla"
    assert cut_back(text) == "Para.\n\nExample:\n\n```python\nx = 1\ny = x + 1\n```"
    text = "Para.\n\nIn bash:\n\n```bash\nset -e\necho hi\npytest -q tes"
    assert cut_back(text) == "Para.\n\nIn bash:\n\n```bash\nset -e\necho hi\n```"
    nested = "Steps:\n\n1. Run:\n\n   ```bash\n   make test\n   make li"
    assert cut_back(nested) == "Steps:\n\n1. Run:\n\n   ```bash\n   make test\n   ```"


def test_cut_back_inside_broken_code_cuts_before_the_block_and_its_lead_in():
    text = "Para one.\n\nConsider the following code:\n\n```python\nclass A:\n    def f(self):\n        return ("
    assert cut_back(text) == "Para one."
    js = "Filter items. Like this:\n\n```javascript\nfunction f(items) {\n  return items.filter((i) =>"
    assert cut_back(js) == "Filter items."


def test_cut_back_keeps_text_without_any_complete_sentence():
    assert cut_back("just words without an end") == "just words without an end"
    assert cut_back("words without an end\n\n## A heading") == "words without an end"
    assert cut_back("```python\ndef f(:") == "```python\ndef f(:\n```"  # kept, fence closed
    assert cut_back("### Only a heading") == "### Only a heading"  # nothing better to print
