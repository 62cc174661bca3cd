"""Assistant talk (book/talk.py): where a section stops being the section and the model talks to whoever asked for
it; book.md printing the section without it, and defects.json naming it. The talk below is SmolLM2-135M's, from
books written on the embedded engine (benchmarks/context_quality.py)."""

from __future__ import annotations

import pytest

from orchestrator.book.assemble import SectionText, assemble, section_body
from orchestrator.book.defects import find_defects
from orchestrator.book.talk import LEAD_WORDS, Talk, talk_spans, without_talk
from orchestrator.core.outline import Chapter, Outline, Part

GOOD = ("A river's basin is the land that drains into it. Rain that falls anywhere in the basin reaches the river in "
        "the end, through streams, soil or groundwater. That is why a river carries the history of its whole basin.")
MORE = ("The Danube drains a basin of about 800,000 square kilometres, shared by nineteen countries. Its delta on the "
        "Black Sea is one of the largest wetlands in Europe.")

SIGN_OFFS = [
    "I hope this helps! Let me know if you have any questions.",
    "I hope this explanation gives you enough information to understand the DNP.",
    "Let me know if you need anything else.",
    "Please let me know if you would like any further details regarding this topic.",
    "If you have any questions, feel free to ask!",
    "Feel free to ask me anything! If you have questions or need help, just let me know.",
    "P.S. Thank you to everyone who supports me on this journey.",
    "Happy reading!",
    "I made several changes to enhance clarity and coherence while keeping the original message intact.",
    "I made some minor changes to improve the flow and readability of the text while maintaining its meaning.",
    "I've added transitional phrases to improve the flow.",
    "I also added a few examples to illustrate key concepts, making the content more engaging for readers.",
    "**I hope this helps!**",
    "I hope this information inspires you to think differently about the way we approach nature.",
    # without its "I", and after a connective that sums up (stop 44, from the stored books)
    "Hope this helps! Happy learning!",
    "Hope this gives you a good starting point. If you need further details, feel free to ask.",
    "Overall, I hope this helps. If there's anything else you'd like me to add, let me know.",
    "In conclusion, I hope this guide was useful.",
    # reports of edits to "the text" the model believes it was given, however they begin
    "I've rewritten this text using more concise language while maintaining the same level of clarity as the "
    "original text. I added a few sentences to explain the importance of data science tools.",
    "Therefore, I made changes to the original text to make it easier to read and understand.",
    "I tried to keep the content concise while maintaining the essence of the original text. I used simple language.",
    "[Note]\nI made changes to enhance clarity and grammar while maintaining the original message.",
    "I added the explanation of the syntax used in the second paragraph so that readers could understand.",
    "A summary of the above text would require 10 sentences. Here is a rewritten version of the original text.",
]


def _tail(text: str) -> str:
    talk = talk_spans(text)
    assert talk.tail is not None and talk.lead is None, text
    return text[talk.tail:]


@pytest.mark.parametrize("talk", SIGN_OFFS)
def test_a_sign_off_after_the_section_is_cut_from_where_it_opens_to_the_end(talk):
    text = f"{GOOD}\n\n{MORE}\n\n{talk}\n"
    assert _tail(text).startswith(talk)
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}"


def test_a_sign_off_right_after_a_list_is_not_its_last_item():
    text = f"{GOOD}\n\n{MORE}\n\n1. Load the data.\n2. Plot it.\nI hope these examples help! Let me know.\n"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}\n\n1. Load the data.\n2. Plot it."


def test_talk_within_the_last_paragraph_is_cut_from_its_sentence():
    text = f"{GOOD}\n\n{MORE} I hope you enjoyed it. Hope to hear from you soon.\n"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}"


def test_everything_after_a_sign_off_goes_with_it():
    junk = ("\n\n---\n\nHere's the edited text I made to meet the requirements of 250 words per paragraph:\n\n"
            "1. Introduction\n2. First DBD\n\n```python\nprint('hello')\n```\n\n### Design Patterns: Behavior (DPB)\n")
    text = f"{GOOD}\n\n{MORE}\n\nI hope this helps! Let me know if you have any other questions.{junk}"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}"


def test_a_short_lead_in_goes_alone_and_the_section_stays():
    lead = "Here's a rewritten version with improved clarity and grammar:"
    text = f"{lead}\n\n{GOOD}\n\n{MORE}\n"
    talk = talk_spans(text)
    assert talk.tail is None and talk.lead is not None and text[slice(*talk.lead)] == lead
    assert without_talk(text, talk) == f"{GOOD}\n\n{MORE}"
    sure = f"Sure! Here's a revised version of the text:\n\n{GOOD}"
    assert without_talk(sure, talk_spans(sure)) == GOOD
    # a heading the model opened with says nothing yet: the lead-in after it is still a lead-in
    headed = f"## Cloud Computing\n\n{text}"
    assert without_talk(headed, talk_spans(headed)) == f"## Cloud Computing\n\n{GOOD}\n\n{MORE}"
    # a lead-in and a sign-off in one section: both go
    both = f"{lead}\n\n{GOOD}\n\n{MORE}\n\nI hope this helps!"
    talk = talk_spans(both)
    assert talk.lead and talk.tail and without_talk(both, talk) == f"{GOOD}\n\n{MORE}"
    assert talk.spans(len(both)) == (talk.lead, (talk.tail, len(both)))


def test_a_first_paragraph_that_goes_on_to_content_is_kept():
    long_lead = "I made several changes to the text. " + " ".join(["The river runs to the sea."] * LEAD_WORDS)
    assert not talk_spans(f"{long_lead}\n\n{GOOD}\n")
    # short, but its second sentence is content: kept whole
    git = ("I made several changes to the text. Git stores snapshots, not diffs, and every clone holds the full "
           "history.")
    assert not talk_spans(f"{git}\n\n{GOOD}\n")
    # one lead-in at most: a second talking paragraph is the section's (it is followed by most of it)
    two = f"Here's a revised version:\n\nI made several changes to improve clarity.\n\n{GOOD}\n\n{MORE}"
    assert without_talk(two, talk_spans(two)) == f"I made several changes to improve clarity.\n\n{GOOD}\n\n{MORE}"


def test_an_opener_followed_by_most_of_the_section_is_the_sections_own_prose():
    story = "I made several changes to the text of the build script. " + " ".join([MORE] * 4)
    text = f"{GOOD}\n\n{story}\n"
    assert not talk_spans(text)
    # the same opener near the end is talk
    assert talk_spans(f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{MORE}\n\nI made several changes to the text.")


def test_a_paragraph_of_talk_between_content_goes_alone():
    # what SmolLM2-135M wrote between a paragraph and its own rewrite of the section
    talk = "Here's a rewritten version of the text with some extra sentences to help keep things flowing smoothly."
    text = f"{GOOD}\n\n{talk}\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"
    spans = talk_spans(text)
    assert spans.lead is None and spans.tail is None and spans.at == "within"
    assert [text[a:b] for a, b in spans.within] == [talk]
    assert without_talk(text, spans) == f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{GOOD}"
    # a critique of "the text" with its lead-in colon, and a sign-off with more of the section after it
    critique = ("This paragraph contains several sentences that could be improved for clarity and concision while "
                "maintaining the essence of the original text. Here's a rewritten version using shorter paragraphs:")
    text = f"{GOOD}\n\n{critique}\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{GOOD}"
    text = f"{GOOD}\n\nI hope this helps you.\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{GOOD}"
    # but a paragraph of talk that introduces code stays with its code, and a lead-in and the talk at the end are
    # cut as before around one within
    intro = f"{GOOD}\n\nI've simplified the content below to one function:\n\n{CODE}\n\n{MORE}\n\n{GOOD}\n"
    assert not talk_spans(intro)
    lead = ("The text above contains multiple sentences that may require rewriting for clarity. Here's a rewritten "
            "version of the text condensed into two concise paragraphs:")
    every = f"{lead}\n\n{GOOD}\n\n{talk}\n\n{MORE}\n\n{GOOD}\n\n{MORE}\n\nLet me know if you have questions."
    spans = talk_spans(every)
    assert spans.at == "both" and len(spans.within) == 1
    assert spans.spans(len(every)) == (spans.lead, spans.within[0], (spans.tail, len(every)))
    assert without_talk(every, spans) == f"{GOOD}\n\n{MORE}\n\n{GOOD}\n\n{MORE}"


# A book's own prose that the openers for reports of edits must not take for talk (a cold review's examples): Roman
# numerals and the letter I, a mountain passage, a chapter revised for an edition, the request and response of HTTP.
PROSE_NEAR_REPORTS = [
    "World War I destroyed the original version of the great organ in the cathedral.",
    "King Charles I commissioned the original version of the altarpiece.",
    "Appendix I reproduces the original text of the treaty.",
    "Last year I saw the original text of the Magna Carta in London.",
    "This chapter shows how a long Makefile can be simplified with pattern rules.",
    "The passage over the mountains can be shortened by taking the tunnel.",
    "The text inside a code block should be edited with care, since whitespace matters.",
    "The text of the license may be revised by the foundation.",
    "The old mountain passage has been shortened by a new tunnel.",
    "This chapter has been revised for the second edition of the guide.",
    "The chapter on testing has been rewritten for Python 3.12.",
    "I changed the request method to POST.",
    "Finally, I changed the request timeout to thirty seconds.",
]


@pytest.mark.parametrize("sentence", PROSE_NEAR_REPORTS)
def test_prose_near_a_report_of_edits_is_not_talk(sentence):
    late = f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{sentence} {MORE}\n"  # where a tail would start
    alone = f"{GOOD}\n\n{sentence}\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"  # a paragraph of its own between content
    assert not talk_spans(late)
    assert not talk_spans(alone).within


def test_a_bare_i_hope_you_may_end_a_section_but_never_cuts_into_one():
    sentence = "I hope you have packed warm clothes, because the pass is cold at night."
    alone = f"{GOOD}\n\n{sentence}\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"
    assert not talk_spans(alone)
    # a sign-off that opens the same way still goes from between content
    signed = f"{GOOD}\n\nI hope you enjoyed this section.\n\n{MORE}\n\n{MORE}\n\n{GOOD}\n"
    assert without_talk(signed, talk_spans(signed)) == f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{GOOD}"


def test_a_sign_off_later_in_a_first_paragraph_that_opens_with_talk_still_ends_the_section():
    # one paragraph (single line breaks): a report of edits, the section, then a sign-off
    text = ("The chapter on machine learning has been condensed into just two sentences for this blog post.\n"
            f"{GOOD}\n{MORE}\nI hope this helps you understand the scope of the chapter.")
    spans = talk_spans(text)
    assert spans.lead is None and spans.tail is not None
    assert text[spans.tail:] == "I hope this helps you understand the scope of the chapter."


@pytest.mark.parametrize("text", [
    # prose that only looks like an opener
    f"{GOOD}\n\nThe .data section has been expanded to hold the table.\n\n{MORE}",
    f"{GOOD}\n\n{MORE}\n\nThis chapter can help you improve your tests.",
    f"{GOOD}\n\n{MORE}\n\nIn the original version of Python, print was a statement.",
    f"{GOOD}\n\n{MORE}\n\nThe paragraph separator in Markdown is a blank line, and the text above shows one.",
    f"{GOOD}\n\n{MORE}\n\nNote: the basin's area is measured on the map, not on the ground.",
    f"{GOOD} I hope the river's level holds this year, farmers say.\n\n{MORE}",
    f"{GOOD} If you have any doubt about the depth, measure it.\n\n{MORE}",
    f"{GOOD}\n\n{MORE} If you need any help installing Python, see Appendix A.",
    f"{GOOD} I added a weir to the model, which cut the flood peak.\n\n{MORE}",
    f"{GOOD} The happy reader of maps knows this.\n\n{MORE}",
    # the words in code, a list, a table, a quote or a heading are content
    f"{GOOD}\n\n```python\n# I hope this helps\nprint('Let me know if you have any questions.')\n```\n",
    f"{GOOD}\n\n- Let me know your basin's area.\n- Feel free to measure it twice.\n",
    f"{GOOD}\n\n| step | note |\n|---|---|\n| 1 | I hope this helps |\n",
    f"{GOOD}\n\n> Let me know when the water rises, said the miller.\n",
    f"{GOOD}\n\n### I hope this helps\n\n{MORE}",
    # a list item's continuation lines, lazy or indented, and a quote's
    f"{GOOD}\n\n- Use a cache only for pure functions. It keeps\n  results correct. Feel free to ask why.\n- Never "
    "cache side effects.\n",
    f"{GOOD}\n\n- Use a cache.\nI hope that you keep it small, the lead said.\n",
    f"{GOOD}\n\n1. Install it.\n\n   I hope this helps, wrote the maintainer.\n\n2. Run it.\n",
    f"{GOOD}\n\n> The miller said the river would rise.\nLet me know when it does, he added.\n",
    # ordinary prose near openers
    f"{GOOD} P. S. Krishnan measured the basin in 1970.",
    f"{GOOD} Hope that the weather holds, because the pass is cold at night.\n\n{MORE}",
    f"{GOOD} Hopefully this helps the reader plan a crossing.\n\n{MORE}",
    f"{GOOD} The engineer told us about it. I hope that the next release keeps the cache, she said.",
    "",
])
def test_content_is_never_talk(text):
    assert not talk_spans(text)
    assert without_talk(text, Talk()) == text


CODE = "```python\nfrom functools import cache\n\n\n@cache\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n```"


@pytest.mark.parametrize("sentence", [
    "Here is the new version of the function, with a cache:",
    "Here is a rewritten version of the function, with a cache:",
    "Feel free to experiment with larger values of n. With the cache, each value is computed once:",
    "Don't hesitate to profile before you optimise. The block shows how:",
    "I've simplified the content below to one function:",
])
def test_only_a_sign_off_takes_code_with_it(sentence):
    text = f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{sentence}\n\n{CODE}\n"
    assert not talk_spans(text)
    signed = f"{GOOD}\n\n{MORE}\n\n{MORE}\n\nI hope this helps! Here is the code again:\n\n{CODE}\n"
    assert without_talk(signed, talk_spans(signed)) == f"{GOOD}\n\n{MORE}\n\n{MORE}"


def test_the_cut_changes_nothing_but_the_cut():
    text = f"{GOOD}\n\n{CODE}\n\n{MORE}\n\nI hope this helps!\n"
    assert without_talk(text, talk_spans(text)) == f"{GOOD}\n\n{CODE}\n\n{MORE}"  # the block's blank lines stay
    bold = f"{GOOD}\n\n**Remember: a basin has one outlet. Feel free to ask about exceptions.**"
    assert without_talk(bold, talk_spans(bold)) == f"{GOOD}\n\n**Remember: a basin has one outlet.**"
    listed = f"{GOOD}\n\n* one **bold** item\n* two\n\nI hope this helps!"
    assert without_talk(listed, talk_spans(listed)) == f"{GOOD}\n\n* one **bold** item\n* two"
    crlf = f"{GOOD}\r\n\r\n{MORE}\r\n\r\nI hope this helps!\r\n"
    assert without_talk(crlf, talk_spans(crlf)) == f"{GOOD}\r\n\r\n{MORE}"


def _section(text: str, path: str = "1.1.1", finish: str = "stop") -> SectionText:
    return SectionText(path, "Part", "Chapter", f"Section {path}", text, finish, completion_tokens=400)


def test_book_md_prints_the_section_without_its_talk_and_defects_name_it():
    signed = _section(f"{GOOD}\n\n{MORE}\n\nI hope this helps! Let me know if you have any questions.\n")
    # the token cap stopped it inside its talk: what is left ends where the model stopped writing the section
    capped = _section(f"{GOOD}\n\nI made several changes to enhance clarity and coherence. I added transiti", "1.1.2",
                      finish="length")
    led = _section(f"Here's a rewritten version with improved clarity:\n\n{GOOD}\n\n{MORE}", "1.1.3")
    clean = _section(f"{GOOD}\n\n{MORE}", "1.1.4")
    between = _section(f"{GOOD}\n\nHere's a rewritten version of the text.\n\n{MORE}\n\n{MORE}\n\n{GOOD}", "1.1.6")
    assert section_body(between) == f"{GOOD}\n\n{MORE}\n\n{MORE}\n\n{GOOD}"
    assert section_body(signed) == f"{GOOD}\n\n{MORE}"
    assert section_body(capped) == GOOD
    assert section_body(led) == f"{GOOD}\n\n{MORE}"
    assert section_body(clean) == f"{GOOD}\n\n{MORE}"
    only = _section("## Rivers\n\nI hope this helps!", "1.1.5")  # talk and nothing else: printed as written
    assert "I hope this helps!" in section_body(only)

    titles = tuple(f"Section 1.1.{i}" for i in range(1, 7))
    outline = Outline("Rivers", (Part("Part", (Chapter("Chapter", titles),)),))
    written = (signed, capped, led, clean, only, between)
    book = assemble(outline, {s.path: s for s in written})
    assert "Let me know" not in book.markdown and "rewritten version" not in book.markdown
    defects = find_defects(book)
    talk = defects.to_json()["assistant_talk"]
    assert talk["count"] == 5  # the section that is talk alone too: printed as written, counted as generated
    by_path = {it["path"]: it for it in talk["sections"]}
    assert set(by_path) == {"1.1.1", "1.1.2", "1.1.3", "1.1.5", "1.1.6"}
    assert by_path["1.1.1"]["at"] == "end" and by_path["1.1.1"]["talk"].startswith("I hope this helps!")
    assert by_path["1.1.2"]["at"] == "end" and by_path["1.1.3"]["at"] == "start"
    assert by_path["1.1.6"]["at"] == "within" and by_path["1.1.6"]["words"] == 7
    assert by_path["1.1.1"]["words"] == 12 and talk["words"] == sum(it["words"] for it in talk["sections"])
    # defects count the text as generated, as for every defect: the words still hold the talk
    assert defects.to_json()["words"]["total"] == sum(len(s.text.split()) for s in written)
    md = defects.to_markdown()
    assert "assistant talk" in md and "## Assistant talk" in md and "talks at the end, 12 words" in md
    assert "talks between its paragraphs, 7 words" in md
