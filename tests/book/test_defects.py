"""Defect report on crafted books whose counts are known."""

from __future__ import annotations

import json
import random

import pytest

from orchestrator.book.assemble import Book, SectionText, assemble, count_words, section_body
from orchestrator.book.defects import Defects, find_defects
from orchestrator.book.textscan import block_ending, near_duplicates, scan_block
from orchestrator.core.outline import Chapter, Outline, Part

DESIGN_KEYS = {
    "duplicate_section_titles", "unterminated_blocks", "truncated_sections", "empty_sections", "failed_sections",
    "code_blocks", "near_duplicate_sections", "looping_sections", "words",
    "repeated_titles", "sibling_overlap",  # issue 28: titles of every level, and how much a chapter repeats itself
    "word_salad",  # prose that stopped reading as language (book/salad.py)
    "assistant_talk",  # the model talking to whoever asked (book/talk.py)
}

_VOCAB = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega", "queue", "cache", "index", "schema", "retry", "token", "thread", "lock", "build", "test", "deploy"]


def prose(seed: int, words: int = 80) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_VOCAB) for _ in range(words)).capitalize() + "."


def make(specs: list[tuple[str, str, dict]]) -> Book:
    """One part, one chapter per 4 sections; specs are (title, text, extra SectionText fields)."""
    chapters = []
    texts: dict[str, SectionText] = {}
    for ci in range(0, len(specs), 4):
        chunk = specs[ci:ci + 4]
        chapters.append(Chapter(f"Chapter {ci // 4 + 1}", tuple(t for t, _, _ in chunk)))
        for si, (title, text, extra) in enumerate(chunk, 1):
            path = f"1.{ci // 4 + 1}.{si}"
            if extra.get("missing"):
                continue
            texts[path] = SectionText(path, "Part", f"Chapter {ci // 4 + 1}", title, text,
                                      **{k: v for k, v in extra.items() if k != "missing"})
    return assemble(Outline("Crafted", (Part("Part", tuple(chapters)),)), texts)


@pytest.mark.parametrize(("text", "ok"), [
    ("It ends here.", True),
    ("Does it?", True),
    ("Wow!", True),
    ("As follows:", True),
    ('He said "stop."', True),
    ("He said “stop”", True),
    ("(in brackets)", True),
    ("**Bold end.**", True),
    ("Call `f()`", True),  # backticks stripped, ")" closes
    ("Wait for it…", True),
    ("It just stops", False),
    ("- a list item without a stop", False),
    ("Use `code`", False),
    ("```python\nx = 1\n```", True),
    ("Text.\n\n```python\nx = (", False),  # cut off inside the fence
    ("Text.\n\n```\nplain\n```\n\n", True),
    ("| a | b |\n|---|---|\n| 1 | 2 |", True),
    ("Intro.\n\n### A heading", False),
    ("~~~~\ncode\n~~~~", True),
    ("````\n```\nstill code\n````", True),
])
def test_block_ending(text, ok):
    assert block_ending(text)[0] is ok


def test_scan_block_reads_fences_in_lists_with_markdown_it():
    text = "1. Step one:\n\n   ```python\n   x = 1\n   ```\n\nDone."
    ok, _, blocks = scan_block(text)
    assert ok
    assert blocks == [("python", "x = 1\n", True)]


def crafted() -> tuple[Book, dict]:
    dup_text = prose(999, 120)
    specs: list[tuple[str, str, dict]] = [
        # duplicate titles: "Error handling" x3, "Logging" x2
        ("Error Handling", prose(1) + "\n\n```python\ndef f(x):\n    return x\n```", {}),          # ok, py ok
        ("error handling!", prose(2) + "\n\nIt just stops", {"finish_reason": "length"}),     # unterminated, truncated
        ("Error   Handling", prose(3) + "\n\n```python\ndef f(:\n    pass\n```", {}),        # py error
        ("Logging", prose(4) + "\n\n```bash\necho hi\n```\n\nAfter.", {}),                    # bash
        ("LOGGING", "", {}),                                                                     # empty
        ("Retries", "", {"error": "HTTP 500 after 4 attempts"}),                                # failed
        ("Caching", prose(5) + "\n\n```python\nwhile True:\n    x = (", {"finish_reason": "length"}),  # unclosed, py error
        ("Indexing", prose(6) + "\n\n```\nplain text\n```", {}),                                # no language
        ("Copies A", dup_text, {}),                                                              # near-duplicate pair
        ("Copies B", dup_text.replace("Alpha", "Beta", 1) + " One more sentence here.", {}),
        ("REPL", prose(7) + "\n\n```py\n>>> x = 1\n>>> x + 1\n2\n```", {}),                     # REPL parses
        ("Lists", prose(8) + "\n\n- first item\n- second item", {}),                           # unterminated
        ("Looping", "Commit often.\n\n" + "Write clear commit messages for every change.\n" * 20, {}),  # loops
        ("Repaired", prose(9), {"repaired_from": "loop: line repeated 9 times: 'x y z w'"}),  # loop repaired
        ("Repair failed", "Tests first.\n\n" + "- Run the whole test suite before you push.\n" * 20,
         {"repaired_from": "loop: line repeated 20 times"}),                                    # still loops
    ]
    book = make(specs)
    written = [s for s in book.sections if not s.failed and not s.empty]
    expected = {
        "duplicates": 2, "duplicate_sections": 5,
        "unterminated": 3, "of": len(written),
        "printed_unterminated": 1,  # the two truncated ones are cut back to a sentence in book.md; "Lists" is not
        "looping": 2, "repaired": 1,
        "truncated": 2, "empty": 1, "failed": 1,
        "code": 6, "by_language": {"python": 3, "bash": 1, "none": 1, "py": 1},
        "py_errors": 2, "py_of": 4, "unclosed": 1, "near": 1,
        "words_total": sum(count_words(s.text) for s in book.sections),
    }
    return book, expected


def test_crafted_book_counts():
    book, exp = crafted()
    d = find_defects(book)
    assert isinstance(d, Defects)
    j = d.to_json()
    assert set(j) == DESIGN_KEYS
    json.dumps(j)  # JSON-ready

    assert j["duplicate_section_titles"]["count"] == exp["duplicates"]
    # every level's titles: here only the sections' repeat (the book, part and chapters are distinct)
    assert j["repeated_titles"]["count"] == exp["duplicates"]
    assert j["repeated_titles"]["titles"][0] == {"title": "Error Handling", "count": 3,
                                                 "paths": ["1.1.1", "1.1.2", "1.1.3"]}
    # the near-duplicate pair shares a chapter (3): their 5-grams are nearly all each other's
    ov = j["sibling_overlap"]
    assert ov["sections"] == exp["of"] and ov["max"] > 0.9 and 0 < ov["mean"] < ov["p90"] <= ov["max"] <= 1
    # the crafted texts name no title of three words or more: set apart or not, the same 5-grams count
    assert ov["every_gram"] == {k: ov[k] for k in ("mean", "p90", "max")}
    assert j["duplicate_section_titles"]["sections"] == exp["duplicate_sections"]
    top = j["duplicate_section_titles"]["titles"][0]
    assert top["count"] == 3 and top["paths"] == ["1.1.1", "1.1.2", "1.1.3"]

    u = j["unterminated_blocks"]
    assert (u["count"], u["of"]) == (exp["unterminated"], exp["of"])
    assert u["share"] == round(exp["unterminated"] / exp["of"], 4)
    assert {s["title"] for s in u["sections"]} == {"error handling!", "Caching", "Lists"}
    assert u["printed"] == {"count": exp["printed_unterminated"], "of": exp["of"],
                            "share": round(exp["printed_unterminated"] / exp["of"], 4)}
    written = [s for s in book.sections if not s.failed and not s.empty]
    assert u["printed"]["count"] == sum(not block_ending(section_body(s))[0] for s in written)  # every one looked at

    lp = j["looping_sections"]
    assert (lp["count"], lp["repaired"]) == (exp["looping"], exp["repaired"])
    assert [s["title"] for s in lp["sections"]] == ["Looping", "Repair failed"]
    assert set(lp["sections"][0]) == {"path", "title", "reason"}
    assert "repeated 20 times" in lp["sections"][0]["reason"]

    assert j["truncated_sections"]["count"] == exp["truncated"]
    assert [s["path"] for s in j["truncated_sections"]["sections"]] == ["1.1.2", "1.2.3"]
    assert j["empty_sections"]["count"] == exp["empty"]
    assert j["empty_sections"]["sections"][0]["title"] == "LOGGING"
    assert j["failed_sections"]["count"] == exp["failed"]
    assert j["failed_sections"]["sections"][0]["error"].startswith("HTTP 500")

    c = j["code_blocks"]
    assert c["count"] == exp["code"]
    assert c["by_language"] == exp["by_language"]
    assert (c["python_syntax_errors"]["count"], c["python_syntax_errors"]["of"]) == (exp["py_errors"], exp["py_of"])
    assert {s["title"] for s in c["python_syntax_errors"]["sections"]} == {"Error   Handling", "Caching"}
    assert c["unclosed_fences"]["count"] == exp["unclosed"]
    assert c["unclosed_fences"]["sections"][0]["title"] == "Caching"

    n = j["near_duplicate_sections"]
    assert n["count"] == exp["near"]
    assert {n["pairs"][0]["a_title"], n["pairs"][0]["b_title"]} == {"Copies A", "Copies B"}
    assert n["pairs"][0]["jaccard"] >= 0.5

    w = j["words"]
    assert w["total"] == exp["words_total"] == book.words
    counts = [count_words(s.text) for s in book.sections if not s.failed]
    assert (w["min"], w["max"]) == (min(counts), max(counts)) and w["min"] == 0  # the empty section
    assert w["mean"] == round(sum(counts) / len(counts), 1)


def test_markdown_report_shows_counts_and_first_lines():
    book, exp = crafted()
    md = find_defects(book).to_markdown()
    assert md.startswith("# Defect report")
    assert f"| unterminated blocks | {exp['unterminated']} of {exp['of']} (" in md
    assert "| failed sections | 1 |" in md
    assert f"| unterminated blocks as printed in book.md | {exp['printed_unterminated']} of {exp['of']} (" in md
    assert (f"| looping sections | {exp['looping']} still looping; {exp['repaired']} repaired (0 of them kept cut "
            "before the loop) |") in md
    assert "## Looping sections" in md and "Repair failed" in md
    assert "## Unterminated blocks" in md and "It just stops" in md
    assert "## Near-duplicate sections" in md and "Copies A" in md
    assert "## Failed sections" in md and "HTTP 500" in md
    assert "Error Handling ×3: 1.1.1, 1.1.2, 1.1.3" in md
    first = next(s for s in book.sections if s.title == "Caching").text.splitlines()[0][:40]
    assert first in md  # worst cases come with their first lines


def test_clean_book_has_no_defects():
    book = make([(f"Title {i}", prose(100 + i) + "\n\n```python\nprint('ok')\n```\n\nThe end.", {}) for i in range(8)])
    j = find_defects(book).to_json()
    assert j["duplicate_section_titles"]["count"] == 0
    assert j["unterminated_blocks"]["count"] == 0 and j["unterminated_blocks"]["share"] == 0.0
    assert j["code_blocks"]["python_syntax_errors"]["count"] == 0
    assert j["code_blocks"]["unclosed_fences"]["count"] == 0
    assert j["near_duplicate_sections"]["count"] == 0
    assert j["looping_sections"] == {"count": 0, "repaired": 0, "cut": 0, "sections": []}
    assert j["unterminated_blocks"]["printed"]["count"] == 0
    for key in ("truncated_sections", "empty_sections", "failed_sections"):
        assert j[key] == {"count": 0, "sections": []}


def test_near_duplicates_find_identical_groups():
    texts = [prose(i, 300) for i in range(1536)]
    same = prose(5000, 200)
    for i in (10, 500, 1500):
        texts[i] = same  # three identical sections -> three pairs
    texts[700] = texts[701][: len(texts[701]) // 2]  # half of another: containment 1.0
    pairs = near_duplicates(texts)  # its speed: benchmarks/near_duplicates.py
    found = {(i, j) for i, j, _, _ in pairs}
    assert found == {(10, 500), (10, 1500), (500, 1500), (700, 701)}


def test_printed_measure_follows_book_md():
    """A truncated section is unterminated as generated and terminated as printed, unless nothing complete exists."""
    cut_mid_sentence = prose(20) + " And then it st"
    no_sentence = "words and words with no end at all"
    book = make([
        ("Cut", cut_mid_sentence, {"finish_reason": "length"}),
        ("Nothing to cut to", no_sentence, {"finish_reason": "length"}),
        ("Stopped", prose(21) + " But it st", {"finish_reason": "stop"}),  # the model's own tail: cut too
    ])
    u = find_defects(book).to_json()["unterminated_blocks"]
    assert (u["count"], u["of"]) == (3, 3)
    assert u["printed"] == {"count": 1, "of": 3, "share": round(1 / 3, 4)}
    assert "And then it st" not in book.markdown and "But it st" not in book.markdown


def test_near_duplicates_agree_with_every_pair_measured():
    """The sampled candidates lose no pair that measuring every pair exactly finds (edited copies, halves, exact
    copies, strangers), and the figures are the exact ones."""
    from orchestrator.book.textscan import NEAR_DUPLICATE_CONTAINMENT, NEAR_DUPLICATE_JACCARD, shingles

    base = [prose(i, 200) for i in range(40)]
    texts = list(base)
    for k in range(0, 40, 4):
        words = base[k].split()
        texts.append(" ".join(words[: len(words) // 2] + ["changed"] * 3 + words[len(words) // 2 + 3:]))  # an edit
        texts.append(" ".join(words[: 2 * len(words) // 3]))  # two thirds of it
    for k in range(1, 40, 6):  # near the thresholds (Jaccard 0.66, ~0.53, 0.50): the end written anew
        words, other = base[k].split(), base[k + 1].split()
        for keep in (0.8, 0.7, 0.67):
            cut = int(len(words) * keep)
            texts.append(" ".join(words[:cut] + other[cut:]))
    texts.append(base[7])  # an exact copy
    sets = [set(shingles(t)) for t in texts]
    want = []
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            a, b = sets[i], sets[j]
            if len(a) < 20 or len(b) < 20:
                continue
            inter = len(a & b)
            jac, con = inter / len(a | b), inter / min(len(a), len(b))
            if jac >= NEAR_DUPLICATE_JACCARD or con >= NEAR_DUPLICATE_CONTAINMENT:
                want.append((i, j, jac, con))
    want.sort(key=lambda t: (-t[2], -t[3], t[0], t[1]))
    assert len(want) >= 21  # the test means something: every edit, every part and the copy pair up
    assert near_duplicates(texts) == want


def test_near_duplicates_beside_boilerplate_every_text_shares():
    """Shingles in too many texts are not counted as shared: the candidates' share is of the rest, so a pair that
    is a near-duplicate beside boilerplate every text holds is still found (and the strangers are not)."""
    import random

    from orchestrator.book.textscan import near_duplicates

    rng = random.Random(1)
    vocab = [f"v{i}" for i in range(5000)]

    def words(k: int) -> list[str]:
        return [rng.choice(vocab) for _ in range(k)]

    boilerplate = words(240)
    texts = [" ".join(boilerplate + words(160)) for _ in range(60)]
    own = texts[0].split()[240:]
    texts.append(" ".join(boilerplate + own[:100] + words(60)))  # Jaccard 0.74 with text 0; others 0.42
    assert [(i, j) for i, j, _, _ in near_duplicates(texts)] == [(0, 60)]


def test_repeated_titles_count_every_level_of_the_outline():
    o = Outline("Testing", (Part("Basics", (Chapter("Testing", ("Mocks", "basics")), Chapter("Tools", ("Mocks",)))),
                            Part("Practice", (Chapter("Tools!", ("Fixtures",)),))))
    book = assemble(o, {})
    rt = find_defects(book).to_json()["repeated_titles"]
    by_title = {t["title"]: t["paths"] for t in rt["titles"]}
    assert rt["count"] == 4 and by_title == {"Testing": ["", "1.1"], "Basics": ["1", "1.1.2"],
                                             "Tools": ["1.2", "2.1"], "Mocks": ["1.1.1", "1.2.1"]}
    assert find_defects(book).to_json()["sibling_overlap"] == {"mean": 0.0, "p90": 0.0, "max": 0.0, "sections": 0,
                                                               "every_gram": {"mean": 0.0, "p90": 0.0, "max": 0.0},
                                                               "printed": {"mean": 0.0, "p90": 0.0, "max": 0.0}}


def test_sibling_overlap_as_printed_leaves_the_talk_out():
    """Two sections of a chapter that end on the same offer of help share its 5-grams as generated; book.md prints
    them without it (book/talk.py), and ``printed`` counts what it prints."""
    sign_off = "\n\nI hope this helps! Please let me know if you have any more questions or need further help."
    texts = ["A cache keeps recently used results close to the code that needs them, so a repeated request skips "
             "the slow trip to the database.",
             "Message queues decouple producers from consumers: work piles up safely while workers restart."]
    o = Outline("Systems", (Part("Parts", (Chapter("Speed", ("Caches", "Queues")),)),))
    book = assemble(o, {f"1.1.{i + 1}": SectionText(f"1.1.{i + 1}", "Parts", "Speed", t, texts[i] + sign_off)
                        for i, t in enumerate(("Caches", "Queues"))})
    ov = find_defects(book).to_json()["sibling_overlap"]
    assert ov["mean"] > 0.2 and ov["printed"] == {"mean": 0.0, "p90": 0.0, "max": 0.0}
    assert "let me know" in book.sections[0].text and "let me know" not in book.markdown
