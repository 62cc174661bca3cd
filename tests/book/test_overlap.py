"""overlap: the share of each section's word 5-grams that its siblings hold, and the book's summary of the shares."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.book.overlap import (
    GRAM,
    NAME_WORDS,
    grams,
    overlap_line,
    overlap_report,
    share_summary,
    sibling_share,
    sibling_shares,
    title_words,
)

CACHE = ("A cache keeps recently used results close to the code that needs them, so that a repeated request "
         "is answered without the slow trip to the database behind it.")
QUEUE = ("Message queues decouple producers from consumers: work piles up safely while workers restart, and "
         "bursts of traffic are smoothed into a steady stream.")
TESTS = ("Property based testing generates many inputs automatically and shrinks every failing example toward "
         "its simplest form before reporting it.")
SHARED = "Measure twice before you optimise any hot path in production."


def _words(k: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{seed}x{rng.randrange(10**9)}" for _ in range(k))


def test_identical_siblings_share_everything():
    shares = sibling_share({"ch1": {"1.1": CACHE, "1.2": CACHE, "1.3": QUEUE}})
    assert shares == {"1.1": 1.0, "1.2": 1.0, "1.3": 0.0}


def test_unrelated_siblings_share_nothing():
    shares = sibling_share({"ch1": {"1.1": CACHE, "1.2": QUEUE, "1.3": TESTS}})
    assert shares == {"1.1": 0.0, "1.2": 0.0, "1.3": 0.0}


def test_one_shared_sentence_gives_a_share_strictly_between():
    shares = sibling_share({"ch1": {"1.1": f"{CACHE} {SHARED}", "1.2": f"{QUEUE} {SHARED}", "1.3": TESTS}})
    assert 0.0 < shares["1.1"] < 1.0 and 0.0 < shares["1.2"] < 1.0 and shares["1.3"] == 0.0
    # exactly the sentence's own 5-grams are shared: those spanning into the sentence before differ
    own = len(grams(SHARED))
    assert shares["1.1"] == pytest.approx(own / len(grams(f"{CACHE} {SHARED}")))


def test_the_share_is_over_distinct_grams_of_the_section():
    # a section repeating a sentence of its own is not sharing with a sibling
    shares = sibling_share({"ch": {"a": f"{CACHE} {CACHE}", "b": QUEUE}})
    assert shares == {"a": 0.0, "b": 0.0}
    # the shorter of two sections, wholly inside the longer, shares all; the longer only that part
    shares = sibling_share({"ch": {"short": SHARED, "long": f"{CACHE} {SHARED} {QUEUE}"}})
    assert shares["short"] == 1.0 and 0.0 < shares["long"] < 1.0


def test_words_are_lowercase_word_tokens_punctuation_and_case_ignored():
    loud = CACHE.upper().replace(",", " ;; ").replace(" ", "  \n ")
    assert sibling_share({"ch": {"a": CACHE, "b": loud}}) == {"a": 1.0, "b": 1.0}
    assert grams("One, two; three: four. Five!") == {("one", "two", "three", "four", "five")}


def test_code_inside_fences_does_not_count():
    code = "```python\n" + "\n".join(f"print('{w}')" for w in CACHE.split()) + "\n```"
    a = f"{QUEUE}\n\n{code}\n"
    b = f"{TESTS}\n\n~~~\n{CACHE}\n~~~\n\n```text\n{CACHE}\n```\n"
    assert sibling_share({"ch": {"a": a, "b": b, "c": f"```\n{QUEUE}\n```"}}) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert grams(f"```\n{CACHE}\n```") == set()
    # an unclosed fence (a section cut at the token cap) hides the rest of the text, as it renders
    assert grams(f"{TESTS}\n\n```\n{CACHE}") == grams(TESTS)


def test_headings_do_not_count_and_grams_do_not_span_dropped_lines():
    heading = "## Why a cache keeps recently used results close"
    assert sibling_share({"ch": {"a": f"{heading}\n\n{QUEUE}", "b": f"{heading}\n\n{TESTS}"}}) == {"a": 0.0,
                                                                                                 "b": 0.0}
    assert grams("one two three\n# Heading here\nfour five six") == set()
    assert grams("one two three\n```\ncode\n```\nfour five six") == set()
    assert grams("one two three\nfour five six") == {("one", "two", "three", "four", "five"),
                                                     ("two", "three", "four", "five", "six")}
    assert grams("#hashtag is a word five") == {("hashtag", "is", "a", "word", "five")}  # no space: no heading


def test_chapters_are_independent():
    shares = sibling_share({"ch1": {"1.1": CACHE, "1.2": QUEUE}, "ch2": {"2.1": CACHE, "2.2": TESTS}})
    assert shares == {"1.1": 0.0, "1.2": 0.0, "2.1": 0.0, "2.2": 0.0}
    assert sibling_share({"ch1": {"1.1": CACHE}}) == {"1.1": 0.0}  # no sibling: nothing shared


def test_sections_under_five_words_get_zero_and_are_counted():
    shares = sibling_share({"ch": {"a": "four words only here", "b": "four words only here", "c": "", "d": CACHE}})
    assert shares == {"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}
    assert share_summary(shares)["sections"] == 4
    assert sibling_share({}) == {} and sibling_share({"empty": {}}) == {}


def test_a_path_in_two_chapters_is_an_error():
    with pytest.raises(ValueError, match=r"1\.1"):
        sibling_share({"ch1": {"1.1": CACHE}, "ch2": {"1.1": QUEUE}})


def test_shares_are_fractions_and_the_result_is_deterministic():
    chapters = {f"ch{c}": {f"{c}.{s}": f"{_words(40, 1000 + c * 100 + s)} {SHARED if s % 2 else ''} {_words(30, c)}"
                           for s in range(6)} for c in range(4)}
    first = sibling_share(chapters)
    assert first == sibling_share(chapters)
    assert list(first) == [p for sections in chapters.values() for p in sections]
    assert all(0.0 < v < 1.0 for v in first.values())  # each shares its chapter's tail, not its own words
    odd = [v for p, v in first.items() if int(p.split(".")[1]) % 2]
    even = [v for p, v in first.items() if not int(p.split(".")[1]) % 2]
    assert min(odd) > max(even)  # the shared sentence adds shared grams


def test_a_large_chapter_is_fast_enough_to_be_linear():
    sections = {f"1.{i}": _words(400, i) for i in range(300)}
    shares = sibling_share({"ch": sections})  # 120,000 words in one chapter: one pass, no pairwise comparison
    assert len(shares) == 300 and set(shares.values()) == {0.0}


# ---------------------------------------------------------------------------------------------------------------
# share_summary


def test_summary_of_no_sections_is_zero():
    assert share_summary({}) == {"mean": 0.0, "p90": 0.0, "max": 0.0, "sections": 0}


def test_summary_mean_p90_by_nearest_rank_and_max():
    shares = {f"s{i}": i / 10 for i in range(1, 11)}  # 0.1 .. 1.0
    assert share_summary(shares) == {"mean": 0.55, "p90": 0.9, "max": 1.0, "sections": 10}
    assert share_summary({"a": 0.25}) == {"mean": 0.25, "p90": 0.25, "max": 0.25, "sections": 1}
    many = {f"s{i}": 0.0 for i in range(95)} | {f"t{i}": 1.0 for i in range(5)}
    summary = share_summary(many)
    assert summary["p90"] == 0.0 and summary["max"] == 1.0 and summary["mean"] == 0.05


def test_summary_is_independent_of_order_and_rounded():
    shares = {f"s{i}": 1 / (i + 3) for i in range(20)}
    reordered = dict(reversed(list(shares.items())))
    assert share_summary(shares) == share_summary(reordered)
    summary = share_summary(shares)
    assert summary["max"] == round(1 / 3, 4)
    assert summary["mean"] == round(math.fsum(shares.values()) / 20, 4)
    assert summary["max"] >= summary["p90"] >= min(shares.values())


def test_gram_is_five():
    assert GRAM == 5
    assert len(grams(" ".join(f"w{i}" for i in range(12)))) == 12 - GRAM + 1


NAMED = "The Danube's Role in Climate Change"


def test_a_title_named_in_the_prose_is_not_shared_prose():
    # two sections pointing to the same sibling by its title share nothing else: no 5-gram counts as shared
    a = f"{CACHE} As {NAMED} shows, rivers store carbon."
    b = f"{QUEUE} Read {NAMED} for the river's part."
    titles = [NAMED, "Rivers"]
    assert sibling_share({"ch": {"a": a, "b": b}}, titles) == {"a": 0.0, "b": 0.0}
    # counted as before without titles: the name's own 5-grams are held by both
    plain = sibling_share({"ch": {"a": a, "b": b}})
    assert plain["a"] > 0.0 and plain["b"] > 0.0
    # a run stops at the name: no 5-gram spans it, and the words on either side still make theirs
    assert grams(f"one two three four five {NAMED} six seven eight nine ten", title_words(titles)) == {
        ("one", "two", "three", "four", "five"), ("six", "seven", "eight", "nine", "ten")}


def test_shared_prose_around_a_name_still_counts():
    shared = f"{SHARED} {NAMED} {SHARED}"
    shares = sibling_share({"ch": {"a": f"{CACHE} {shared}", "b": f"{QUEUE} {shared}"}}, [NAMED])
    assert 0.0 < shares["a"] < 1.0 and 0.0 < shares["b"] < 1.0
    # exactly SHARED's own 5-grams (it appears twice in each: once counted)
    names = title_words([NAMED])
    assert shares["a"] == pytest.approx(len(grams(SHARED)) / len(grams(f"{CACHE} {shared}", names)))


def test_short_titles_are_prose_and_names_match_whole_words_case_blind():
    assert title_words(["Testing", "Best Practices", "What's Next", "Step-by-Step", NAMED, NAMED.upper(), ""]).seqs == (
        ("the", "danube", "s", "role", "in", "climate", "change"),)
    assert NAME_WORDS == 3
    # "Best Practices" is not set apart: identical prose around it stays shared
    text = "Follow best practices when you write the tests for every module"
    assert sibling_share({"ch": {"a": text, "b": text}}, ["Best Practices"]) == {"a": 1.0, "b": 1.0}
    # a name matches whole words only: "in climate changes" is not the title's "in climate change"
    names = title_words(["role in climate change"])
    assert grams("their role in climate changes quickly", names) == {
        ("their", "role", "in", "climate", "changes"), ("role", "in", "climate", "changes", "quickly")}
    # the longest name wins where two start at one word
    names = title_words(["data cleaning steps", "data cleaning steps in pandas"])
    assert grams("a b c d data cleaning steps in pandas e f g h i", names) == {("e", "f", "g", "h", "i")}


def test_names_in_underscore_emphasis_and_overlapping_names():
    names = title_words([NAMED])
    assert grams(f"one two three four five _{NAMED}_ six seven", names) == {("one", "two", "three", "four", "five")}
    # scanning left to right, a name found first stands; an overlapping one from a later word is not cut out
    names = title_words(["alpha beta gamma", "beta gamma delta epsilon zeta"])
    assert grams("x alpha beta gamma delta epsilon zeta eta theta", names) == {
        ("delta", "epsilon", "zeta", "eta", "theta")}


def test_both_shares_come_from_one_pass_and_agree_without_titles():
    a = f"{CACHE} As {NAMED} shows, rivers store carbon."
    b = f"{QUEUE} Read {NAMED} for the river's part."
    named, every = sibling_shares({"ch": {"a": a, "b": b}}, [NAMED])
    assert named == {"a": 0.0, "b": 0.0} and every == sibling_share({"ch": {"a": a, "b": b}})
    assert every["a"] > 0.0
    assert sibling_shares({"ch": {"a": a, "b": b}}) == (every, every)
    with pytest.raises(ValueError, match="more than one chapter"):
        sibling_shares({"c1": {"a": a}, "c2": {"a": b}}, [NAMED])


def test_overlap_report_and_its_line():
    a = f"{CACHE} As {NAMED} shows, rivers store carbon."
    b = f"{QUEUE} Read {NAMED} for the river's part."
    report = overlap_report({"ch": {"a": a, "b": b}}, [NAMED])
    assert report["mean"] == 0.0 and report["sections"] == 2 and report["every_gram"]["mean"] > 0.0
    line = overlap_line(report)
    assert line.startswith("mean 0.0%, p90 0.0%, max 0.0%; every 5-gram counted: mean ")
    assert overlap_line({"mean": 0.25, "p90": 0.5, "max": 1.0}) == "mean 25.0%, p90 50.0%, max 100.0%"


def test_overlap_report_as_printed():
    """``printed``: the same sections as another text gives them (book.md's): its own shares, names set apart."""
    as_written = {"ch": {"a": f"{CACHE} {SHARED}", "b": f"{QUEUE} {SHARED}"}}
    as_printed = {"ch": {"a": CACHE, "b": QUEUE}}
    report = overlap_report(as_written, [], as_printed)
    assert report["mean"] > 0.0 and report["printed"] == {"mean": 0.0, "p90": 0.0, "max": 0.0}
    assert overlap_line(report).endswith("; as book.md prints them: mean 0.0%")
    assert overlap_report(as_printed, [], as_written)["printed"]["mean"] == report["mean"]
    assert "printed" not in overlap_report(as_written, [])
