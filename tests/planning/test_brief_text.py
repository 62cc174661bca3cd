"""The book brief's reply -> the brief (planning/brief.clean_brief): what a model wraps around it is dropped, it is
kept to MAX_BRIEF_WORDS words ending on a sentence, and a reply with no brief in it gives none."""

from __future__ import annotations

import pytest

from orchestrator.core.outline import normal_brief
from orchestrator.planning.brief import MAX_BRIEF_WORDS, MIN_BRIEF_WORDS, clean_brief

PLAIN = ("This book is for engineers in their first years of work. It speaks to the reader as a colleague would. "
         "One running example, a small bookshop's order service, carries through every chapter. The words "
         "\"service\" and \"release\" keep one meaning throughout.")


def test_a_plain_paragraph_is_kept_as_it_is():
    assert clean_brief(PLAIN) == PLAIN == normal_brief(PLAIN)


@pytest.mark.parametrize("wrapped", [
    f"Here is the book brief:\n\n{PLAIN}",
    f"Sure! Below is a brief.\n\n**Brief:** {PLAIN}",
    f"# Book brief\n\n{PLAIN}\n\n```text\nnot part of it\n```",
    f"Brief: {PLAIN}",
    f"- {PLAIN}",
    f"Here is the book brief: {PLAIN}",  # the lead-in and the brief on one line: the lead-in goes, the brief stays
    f"Sure! {PLAIN}",
    f"Certainly. Here's a brief for the book: {PLAIN}",
])
def test_lead_ins_labels_headings_markers_and_code_are_dropped(wrapped):
    assert clean_brief(wrapped) == PLAIN


def test_paragraphs_stay_apart_and_whitespace_is_normal():
    two = "This book is for new team leads.\n  It speaks   plainly.\n\n\nIts running example is a ticket service used throughout."
    assert clean_brief(two) == ("This book is for new team leads. It speaks plainly.\n\n"
                                "Its running example is a ticket service used throughout.")


def test_a_long_reply_is_cut_back_to_a_sentence_within_the_limit():
    # prose past the limit (one sentence said forty times is a loop: below)
    reply = (
        "This handbook is for engineers who keep a small online bookshop running. Every chapter returns to the shop: "
        "its orders, payments and refunds, the stock it counts each night, and the invoices it sends to publishers. "
        "The voice is plain and direct, and each idea is shown on the shop before it is named. Terms keep one meaning "
        "throughout: an order is what a customer confirms, a payment is money received, a refund is money sent back. "
        "Early parts cover version control, testing and code review, because the shop's first outage came from an "
        "untested change. Middle parts turn to data: the schema of the orders table, migrations that never lock it, "
        "and reports the owners read on Monday mornings. Later parts cover deployment, monitoring and incidents, "
        "with the night the payment provider timed out as the running example. Readers should know one programming "
        "language and have shipped something small; nothing else is assumed. Exercises ask the reader to change the "
        "shop, break it on purpose, and explain what the logs show. A glossary at the end repeats each term with the "
        "page where it is defined, and every code sample runs against the shop's own repository."
    )
    brief = clean_brief(reply)
    assert 0 < len(brief.split()) <= MAX_BRIEF_WORDS
    assert brief.endswith(".") and brief == normal_brief(brief)


def test_a_reply_cut_by_its_token_cap_ends_on_its_last_complete_sentence():
    cut = PLAIN + " The second paragraph starts and then the"
    assert clean_brief(cut, truncated=True) == PLAIN
    # a last sentence without its closing punctuation is dropped even when the reply was not cut
    assert clean_brief(PLAIN + " And then it trails off without") == PLAIN


@pytest.mark.parametrize("empty", ["", "   ", "Brief:", "Here is the brief:", "```\ncode only\n```",
                                   "A Software Engineering Handbook.", "# A title alone"])
def test_a_reply_without_a_brief_in_it_gives_none(empty):
    assert clean_brief(empty) == ""


def test_fewer_than_the_minimum_words_is_no_brief():
    short = " ".join(["word"] * (MIN_BRIEF_WORDS - 2)) + "."
    assert clean_brief(short) == ""
    assert clean_brief(" ".join(["word"] * MIN_BRIEF_WORDS) + ".") != ""


def test_a_reply_caught_in_a_loop_gives_none():
    line = "This book is for engineers who maintain large systems and want them to stay simple. "
    assert clean_brief(line * 2) == normal_brief(line * 2)  # said twice is not yet a loop
    assert clean_brief((line + "\n") * 12) == ""
    assert clean_brief(line * 12, truncated=True) == ""
