"""Distinct titles across the book (issue 28 §3): the planner's one set of taken titles, as nodes commit, restore
and accept their lists; the last resort of a node left short never takes a title another node holds."""

from __future__ import annotations

from orchestrator.book.checks import norm_title as norm
from orchestrator.planning import parse_titles
from orchestrator.planning.stream import Expansion


def test_titles_restored_from_an_earlier_run_are_taken_before_any_other_node_streams():
    # A rerun after a kill: node B's committed titles come back from the journal; node D, re-asked in the same run,
    # offers one of them first. D must skip it (its spare takes the place), not commit it a second time.
    taken: set[str] = set()
    b = Expansion(3, False, lambda i, t, x: None, taken=taken, spares=True)
    b.restore(None, ("Load Testing", "Caching"))
    assert {norm("Load Testing"), norm("Caching")} <= taken
    started: list[str] = []
    d = Expansion(2, False, lambda i, t, x: started.append(t), taken=taken, spares=True)
    d.new_attempt()
    d.on_delta('{"items": ["Load Testing", "Profiling", "Tracing", "Sampling"]}')
    assert started == ["Profiling", "Tracing"]
    assert d.collided == [] or d.collided == ["Load Testing"]


def test_a_node_left_short_never_takes_a_title_another_node_holds():
    taken = frozenset({norm("Testing"), norm("Deployment")})
    # the last attempt (not strict), qualified by the node's own title: taken titles come back as its own
    got = parse_titles("1. Testing\n2. Deployment\n3. Observability", 3, False, strict=False, taken=taken,
                       qualify="Web Services")
    assert list(got.items) == ["Observability", "Testing in Web Services", "Deployment in Web Services"]
    # without a title to qualify them by, a taken title is left out: a shorter chapter, not a repeated title
    bare = parse_titles("1. Testing\n2. Deployment\n3. Observability", 3, False, strict=False, taken=taken)
    assert list(bare.items) == ["Observability"]


def test_a_node_with_no_strong_title_takes_a_weak_one_that_repeats_nothing_before_a_copy():
    # Seen on SmolLM2-135M: a chapter's last attempt offered only a copy of its own title and a cut-off near copy;
    # the copy must not become a section title (the book would hold it twice) while the other is at hand.
    part, chapter = "The River Nile: A Global Perspective", "The Nile: A Global Perspective on Sustainable Agriculture"
    avoid = frozenset({norm(part), norm(chapter)})  # its ancestors: the cut-off title nearly copies the part's
    taken = frozenset({*avoid, norm("The Nile: A Global Perspective on Climate Change")})
    reply = f"1. {chapter}\n2. The Nile: A Global Perspective on Climate Change\n3. The Nile: A Global Perspective on"
    got = parse_titles(reply, 4, False, avoid=avoid, strict=False, taken=taken, qualify=chapter)
    # the one that repeats nothing first; the copies still fill the node up to what it was offered (a chapter keeps
    # its sections: the real engine's 2 x 2 x 3 book must have 12)
    assert got.items[0] == "The Nile: A Global Perspective on" and len(got.items) == 3
    # with nothing but copies on offer the node still keeps a title rather than fail the book
    only = parse_titles(f"1. {chapter}", 4, False, avoid=avoid, strict=False, taken=taken, qualify=chapter)
    assert list(only.items) == [chapter]
