"""assemble: outline order, demoted headings, closed fences, failed sections marked."""

from orchestrator.assemble import SectionText, assemble, close_fences, demote_headings
from orchestrator.outline import Chapter, Outline, Part


def test_demote_headings_skips_code_and_drops_a_repeated_title():
    text = "## Intro\n\nText\n\n```py\n# a comment, not a heading\n```\n\nSub\n---\n\nMore"
    out = demote_headings(text, drop_title="intro")
    assert "## Intro" not in out and "# a comment, not a heading" in out
    assert "###### Sub" in out
    assert demote_headings("# Foo\nbar\n## Baz").splitlines() == ["##### Foo", "bar", "###### Baz"]


def test_close_fences():
    assert close_fences("a\n```py\nx = 1") == "a\n```py\nx = 1\n```"
    assert close_fences("a\n```py\nx = 1\n```\nb") == "a\n```py\nx = 1\n```\nb"
    assert close_fences("~~~~\n```\n~~~~") == "~~~~\n```\n~~~~"


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
