"""Word salad (book/salad.py): where a section's prose stops reading as language, book.md cutting it off, and
defects.json naming it. The salad below is SmolLM2-135M's, from the small profile's loop re-ask before stop 40
(repetition penalty 1.3 at temperature 0.7) on the embedded engine."""

from __future__ import annotations

from orchestrator.book.assemble import SectionText, section_body
from orchestrator.book.defects import find_defects
from orchestrator.book.salad import RUN_ON, WINDOW, salad_at
from orchestrator.core.outline import Chapter, Outline, Part

GOOD = ("A river's basin is the land that drains into it. Rain that falls anywhere in the basin reaches the river in "
        "the end, through streams, soil or groundwater. That is why a river carries the history of its whole basin: "
        "the salt of its fields, the silt of its hills and the waste of its towns. ")
SALAD = ("allowed think differently way jobs mandate companies alot more responsibilites than governments allow too "
         "consider peoples lives first before company start having rules others don' t agree most times involve "
         "making lots arguments comparing stuff between countries multiple issues discussed over various decades big "
         "enough here nowadays problem seems second century during reigning empires bring out huge variety ideas "
         "problems often seen everywhere else although little while ago ancient Egyptians brought. ")
THIN = ("men very many girls mothers most close women got stories told around small tables cooking soup usually "
        "eaten every morning probably often breakfast eating dinner praying health lots especially gardening brought me home i love both "
        "animals, too some religions dont allow any animal eat meat seriously unless technically okay scared away "
        "sheep killing fishing boats sometimes gone out trying greedily gaining hair compassion kindness giving "
        "everybody makes sure environment getting better community good pastoral caring benefitting helping less")
SALAD += THIN
RUN = ("and so the people went on walking by the river while the sun was up and the birds were singing in the trees "
       "that stood by the water where the children played with the boats that their fathers had made for them in the "
       "long winter when the snow lay on the hills and the river was frozen from one bank to the other and nobody "
       "could cross it except on foot with a stick to test the ice before each step that they took on the way home "
       "to the small houses where their mothers were waiting for them with bread")


def test_prose_reads_as_language_and_salad_does_not():
    assert salad_at(GOOD * 6) is None
    text = GOOD * 2 + SALAD
    at = salad_at(text)
    # never inside the prose: within the salad (its first sentence still holds 15% function words, which real
    # prose of a list-heavy kind can hold too; the threshold is under it, so the cut falls at its second)
    assert at is not None and len(GOOD) * 2 <= at < len(text)
    thin = salad_at(THIN)
    assert thin is not None and thin < 80  # within a window's step of its start


def test_a_sentence_that_never_ends_is_salad_from_its_start():
    assert len(RUN.split()) > RUN_ON
    assert salad_at(GOOD * 2 + RUN + ".") == len(GOOD) * 2
    # the same words cut into sentences are prose
    sentences = RUN.replace(" and ", ". And ").replace(" while ", ". While ")
    assert salad_at(GOOD + sentences + ".") is None


def test_code_lists_tables_and_headings_are_not_read_as_prose():
    names = " ".join(f"pandas numpy scipy matplotlib seaborn polars duckdb arrow{i}" for i in range(12))
    fenced = GOOD + "\n```python\n" + "\n".join(f"import {w}" for w in names.split()) + "\n```\n" + GOOD
    listed = GOOD + "\n" + "\n".join(f"- {w.title()} Toolkit" for w in names.split()) + "\n\n" + GOOD
    table = GOOD + "\n| tool | kind |\n|---|---|\n" + "\n".join(f"| {w} | library |" for w in names.split()) + "\n"
    heads = GOOD + "\n" + "\n".join(f"## {w.title()} Module Overview" for w in names.split()[:30]) + "\n" + GOOD
    steps = GOOD + "\n" + "\n".join(f"Step {i}: {w} install configure verify." for i, w in enumerate(names.split()))
    glossary = GOOD + "\n" + "\n".join(f"**{w}**: random unit reducing overfitting." for w in names.split()) + "\n"
    refs = GOOD + "\n" + "\n".join(f"[{i}] Goodfellow, I., Bengio, Y. Deep Learning, MIT Press, 2016" for i in range(40))
    nested = GOOD + "\n1. Install the tools:\n\n    ```bash\n" + "".join(f"    pip install {names}\n" for _ in range(3)) \
        + "    ```\n\n2. Run the checks.\n\n" + GOOD
    french = ("Le bassin d'un fleuve est la terre qui s'y écoule, et la pluie qui tombe dans le bassin rejoint le fleuve "
              "par les ruisseaux, le sol ou les nappes: c'est pourquoi un fleuve porte l'histoire de tout son bassin, le "
              "sel de ses champs, le limon de ses collines et les déchets de ses villes. ") * 3
    for text in (fenced, listed, table, heads, steps, glossary, refs, nested, GOOD + "\n\n" + french):
        assert salad_at(text) is None, text[:200]
    # fewer prose words than a window are never judged by the function-word share
    assert salad_at(" ".join(SALAD.split()[: WINDOW - 1]) + ".") is None


def _section(text: str, path: str = "1.1.1", finish: str = "stop") -> SectionText:
    return SectionText(path, "Part", "Chapter", f"Section {path}", text, finish, completion_tokens=400)


def test_book_md_prints_a_section_cut_back_before_its_salad_and_defects_name_it():
    s = _section(GOOD * 3 + "\n\n" + SALAD)
    printed = section_body(s)
    assert printed.startswith(GOOD.strip()) and printed.rstrip().endswith(".") and "fishing boats" not in printed
    assert salad_at(printed) is None
    whole = _section(THIN, "1.1.2")  # salad from its first word: nothing to cut back to
    assert section_body(whole).startswith(THIN[:60])
    after_list = _section(GOOD + "\n- Load the data\n- Plot the results\n" + THIN, "1.1.4")  # no full stop before
    assert section_body(after_list).endswith("- Plot the results") and "fishing" not in section_body(after_list)
    clean = _section(GOOD * 3, "1.1.3")
    assert section_body(clean) == (GOOD * 3).strip()

    outline = Outline("Rivers", (Part("Part", (Chapter("Chapter", ("Section 1.1.1", "Section 1.1.2",
                                                                    "Section 1.1.3")),)),))
    from orchestrator.book.assemble import assemble

    book = assemble(outline, {x.path: x for x in (s, whole, clean)})
    salad = find_defects(book).to_json()["word_salad"]
    assert salad["count"] == 2 and salad["cut"] == 1
    by_path = {it["path"]: it for it in salad["sections"]}
    assert set(by_path) == {"1.1.1", "1.1.2"}
    assert by_path["1.1.1"]["cut"] and by_path["1.1.1"]["words_before"] >= len((GOOD * 3).split())
    assert not by_path["1.1.2"]["cut"] and by_path["1.1.2"]["words_before"] < 15
    md = find_defects(book).to_markdown()
    assert "word salad" in md and "printed cut back before it" in md
