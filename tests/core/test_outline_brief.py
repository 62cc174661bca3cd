"""The book brief in the outline values, outline.json and outline.md (issue 28 §1): carried, round-tripped, editable;
and what each SectionRef carries besides its titles."""

from __future__ import annotations

import pytest

from orchestrator.core.outline import Chapter, Outline, Part, SectionRef, normal_brief
from orchestrator.core.outline_md import BRIEF_WIDTH, OutlineFileError, edits_in, read_outline_md, render_outline_md

BRIEF = ("This book is for working engineers who want to reason about their systems. It is written in a plain voice. "
         "One running example carries through every chapter: a small online bookshop with its catalogue, orders and "
         "payments. The terms \"service\", \"deploy\" and \"incident\" keep one meaning throughout.\n\n"
         "Sections assume the chapters before them and refer back to the bookshop rather than start a new example.")

OUTLINE = Outline("Rivers of C#", (
    Part("Western Europe", (Chapter("The Rhine", ("Source", "Delta"), (None, 400)), Chapter("The Seine", ("Paris",)))),
    Part("Part: F#", (Chapter("Intro to C#", ("Vienna", "Budapest")),)),
), BRIEF)


def test_normal_brief_is_idempotent_and_keeps_paragraphs():
    messy = "  One   line\nwrapped here.  \n\n\n  Second\tparagraph. \n \n"
    assert normal_brief(messy) == "One line wrapped here.\n\nSecond paragraph."
    assert normal_brief(normal_brief(messy)) == normal_brief(messy)
    assert normal_brief(BRIEF) == BRIEF
    assert normal_brief("") == normal_brief(" \n\n ") == ""


def test_outline_json_carries_the_brief_only_when_there_is_one():
    data = OUTLINE.to_json()
    assert data["brief"] == BRIEF
    assert Outline.from_json(data) == OUTLINE
    plain = Outline(OUTLINE.title, OUTLINE.parts)
    assert "brief" not in plain.to_json()  # outline.json without a brief is what it always was
    assert Outline.from_json(plain.to_json()) == plain and Outline.from_json(plain.to_json()).brief == ""


def test_section_refs_carry_the_brief_the_parts_chapters_and_the_chapters_sections():
    refs = list(OUTLINE.sections())
    assert [r.path for r in refs] == ["1.1.1", "1.1.2", "1.2.1", "2.1.1", "2.1.2"]
    assert all(r.brief == BRIEF for r in refs)
    assert refs[0].part_chapters == refs[2].part_chapters == ("The Rhine", "The Seine")
    assert refs[3].part_chapters == ("Intro to C#",)
    assert refs[0].siblings == refs[1].siblings == ("Source", "Delta")
    assert refs[2].siblings == ("Paris",)
    assert refs[1].words == 400
    # the positional fields and the journal's context are unchanged: older journals still resume
    old = SectionRef("1.1.2", "Rivers of C#", "Western Europe", "The Rhine", "Delta", 400)
    assert old.context(250) == refs[1].context(250) == {
        "book": "Rivers of C#", "part": "Western Europe", "chapter": "The Rhine", "words": 250}
    assert (old.brief, old.part_chapters, old.siblings) == ("", (), ())


def test_outline_md_round_trips_the_brief_wrapped_for_an_editor(tmp_path):
    text = render_outline_md(OUTLINE, tmp_path)
    quoted = [ln for ln in text.splitlines() if ln.startswith(">")]
    assert len(quoted) >= 4 and ">" in quoted  # wrapped, and a bare ">" between its two paragraphs
    assert all(len(ln) <= BRIEF_WIDTH + 2 for ln in quoted)
    assert text.index("> This book") < text.index("## Western Europe")
    path = tmp_path / "outline.md"
    path.write_text(text)
    assert read_outline_md(path) == OUTLINE
    assert edits_in(tmp_path, OUTLINE) == (False, OUTLINE)


def test_an_edited_or_deleted_brief_is_what_write_carries(tmp_path):
    path = tmp_path / "outline.md"
    text = render_outline_md(OUTLINE, tmp_path)
    first = next(ln for ln in text.splitlines() if ln.startswith("> "))
    path.write_text(text.replace(first, "> For beginners only, in a friendly voice."))
    edited = read_outline_md(path)
    assert edited.brief.startswith("For beginners only, in a friendly voice.")
    assert edited.parts == OUTLINE.parts
    assert edits_in(tmp_path, OUTLINE) == (True, edited)
    path.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith(">")) + "\n")
    assert read_outline_md(path) == Outline(OUTLINE.title, OUTLINE.parts)
    # several quote blocks separated by blank lines are paragraphs of one brief
    path.write_text("# Book\n\n> First part of it,\n> still the first.\n\n> Second.\n\n## P\n### C\n- S\n")
    assert read_outline_md(path).brief == "First part of it, still the first.\n\nSecond."


def test_an_older_outline_md_without_a_brief_reads_as_before(tmp_path):
    path = tmp_path / "outline.md"
    path.write_text("# Book\n\n## Part\n\n### Chapter\n\n- Section\n  words: 300\n")
    got = read_outline_md(path)
    assert got == Outline("Book", (Part("Part", (Chapter("Chapter", ("Section",), (300,)),)),))
    assert got.brief == ""
    assert not any(ln.startswith(">") for ln in render_outline_md(got).splitlines())


@pytest.mark.parametrize(("text", "line", "what"), [
    ("> A brief first\n# Book\n## P\n### C\n- S\n", 1, "before the book title"),
    ("# Book\n## P\n> too late\n### C\n- S\n", 3, "before the first '## Part'"),
])
def test_a_brief_line_out_of_place_names_its_line(tmp_path, text, line, what):
    path = tmp_path / "outline.md"
    path.write_text(text)
    with pytest.raises(OutlineFileError) as e:
        read_outline_md(path)
    assert f"outline.md:{line}:" in str(e.value) and what in str(e.value)
