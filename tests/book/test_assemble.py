"""assemble: outline order, demoted headings, closed fences, failed sections marked."""

import dataclasses

from orchestrator.book.assemble import SectionText, assemble, demote_headings, section_body
from orchestrator.book.fences import close_open_fence
from orchestrator.core.outline import Chapter, Outline, Part


def test_demote_headings_skips_code_and_drops_a_repeated_title():
    text = "## Intro\n\nText\n\n```py\n# a comment, not a heading\n```\n\nSub\n---\n\nMore"
    out = demote_headings(text, drop_title="intro")
    assert "## Intro" not in out and "# a comment, not a heading" in out
    assert "###### Sub" in out
    assert demote_headings("# Foo\nbar\n## Baz").splitlines() == ["##### Foo", "bar", "###### Baz"]


def test_close_open_fence():
    assert close_open_fence("a\n```py\nx = 1") == "a\n```py\nx = 1\n```"
    assert close_open_fence("a\n```py\nx = 1\n```\nb") == "a\n```py\nx = 1\n```\nb"
    assert close_open_fence("~~~~\n```\n~~~~") == "~~~~\n```\n~~~~"


def test_assemble_places_every_section_in_outline_order():
    outline = Outline("Book", (Part("P1", (Chapter("C1", ("S1", "S2")),)), Part("P2", (Chapter("C2", ("S3",)),))))
    sections = {
        "1.1.1": SectionText("1.1.1", "P1", "C1", "S1", "One.\n\n```py\nx = 1"),
        "2.1.1": SectionText("2.1.1", "P2", "C2", "S3", "Three."),
        "1.1.2": SectionText("1.1.2", "P1", "C1", "S2", "", error="failed after 8 attempts: HTTP 500"),
    }
    book = assemble(outline, sections)
    md = book.markdown
    assert md.index("#### S1") < md.index("#### S2") < md.index("## P2") < md.index("#### S3")
    assert "x = 1\n```\n\n#### S2" in md  # the cut-off fence is closed before the next heading
    assert "This section is missing" in md and "HTTP 500" in md
    assert [s.path for s in book.sections] == ["1.1.1", "1.1.2", "2.1.1"]
    assert book.sections[1].failed


def test_section_text_fields_keep_their_order_and_the_repairs_come_last():
    names = [f.name for f in dataclasses.fields(SectionText)]
    assert names == ["path", "part", "chapter", "title", "text", "finish_reason", "completion_tokens", "backend",
                     "error", "repaired_from", "code_repaired", "rewritten_from", "loop_cut"]
    s = SectionText("1.1.1", "P", "C", "T", "x")
    assert s.repaired_from is None
    assert dataclasses.replace(s, repaired_from="loop: line repeated 5 times").repaired_from.startswith("loop")


def test_a_section_stopped_by_the_cap_is_cut_back_in_the_book():
    outline = Outline("Book", (Part("P1", (Chapter("C1", ("S1", "S2", "S3")),)),))
    capped = "It works. It scales to many users with the righ"
    in_code = "Intro text.\n\nSee:\n\n```python\nclass A:\n    def f(self):\n        return ("
    sections = {
        "1.1.1": SectionText("1.1.1", "P1", "C1", "S1", capped, "length"),
        "1.1.2": SectionText("1.1.2", "P1", "C1", "S2", in_code, "length"),
        # the model stopped, leaving a tail that is no sentence: the tail goes, the rest is printed as written
        "1.1.3": SectionText("1.1.3", "P1", "C1", "S3", "It works well. " * 4 + "#tips #more", "stop"),
    }
    md = assemble(outline, sections).markdown
    assert "It works.\n\n#### S2" in md
    assert "Intro text.\n\n#### S3" in md  # the broken snippet and its lead-in are cut
    assert md.rstrip().endswith("It works well.")
    headings_only = SectionText("1.1.3", "P1", "C1", "S3", "## 2023\n" * 10, "stop")
    assert section_body(headings_only).count("2023") == 10  # would lose everything: printed as written
    assert [s.text for s in assemble(outline, sections).sections][:2] == [capped, in_code]  # raw text kept
    assert section_body(sections["1.1.1"]) == "It works."


def test_code_that_does_not_parse_is_printed_with_a_note_and_good_code_without():
    broken = SectionText("1.1.1", "P", "C", "S", "Try this:\n\n```python\nfor x in range(3)\n    print(x)\n```\n\nDone.")
    good = dataclasses.replace(broken, text="Try this:\n\n```python\nfor x in range(3):\n    print(x)\n```\n\nDone.")
    assert "> **Note:** the Python above does not parse (line 1: SyntaxError" in section_body(broken)
    assert "Note:" not in section_body(good)
    book = assemble(Outline("B", (Part("P", (Chapter("C", ("S",)),)),)), {"1.1.1": broken})
    assert book.markdown.count("> **Note:** the Python above does not parse") == 1
    assert book.sections[0].text == broken.text  # the text as generated (what defects count) is untouched


def test_code_the_model_never_closed_is_cut_code_and_gets_no_note():
    open_block = SectionText("1.1.1", "P", "C", "S", "Here is code:\n\n```python\ndef f(x):\n    return [x,\n",
                             finish_reason="stop")
    capped = dataclasses.replace(open_block, text='Data:\n\n```json\n{"a": [1, 2],\n "b": 3\n',
                                 finish_reason="length")
    for s in (open_block, capped):  # kept and closed for printing, by cut_back: not blamed for the cut
        body = section_body(s)
        assert body.endswith("```") and "Note:" not in body, body
    both = dataclasses.replace(open_block, text="```python\ndef f(:\n```\n\nThen:\n\n```python\ndef g(x):\n    [x,\n")
    assert section_body(both).count("Note:") == 1  # the closed broken block is noted, the cut one is not


def test_a_line_separator_inside_a_line_is_no_line_break_for_the_headings():
    # markdown-it breaks lines at "\n" only; str.splitlines also at U+2028, which shifted every heading after one
    text = "Intro with a\u2028separator.\n\n## Step\n\n```python\nSEP = 'a\u2028b'\n```\n\nEnd."
    out = demote_headings(text)
    assert out == text.replace("## Step", "###### Step")
    body = section_body(SectionText("1.1.1", "P", "C", "S", text))
    assert "SEP = 'a\u2028b'" in body and "Note:" not in body
