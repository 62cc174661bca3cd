"""What the views count when a written section is asked again (a repair, a continuation) and when the book's brief
fails (issue 28): no section is counted lost that kept its text, and a book without a brief loses no node."""

from __future__ import annotations

from orchestrator.core.events import NodeFailed, NodeFinished, NodeStarted
from orchestrator.core.reply import Reply
from orchestrator.views.jobstate import JobState

A = "http://gpu1:8000/v1"


def reply(tokens: int) -> Reply:
    return Reply("text", "stop", 10, tokens, A, 0.0, 0.1, 0.2)


def test_a_reask_that_fails_after_the_section_was_written_is_no_lost_section():
    s = JobState()
    for e in (NodeStarted("1.1.1", "section", "s1", A, 1, 1.0),
              NodeFinished("1.1.1", "section", "s1", reply(300), 2.0),
              NodeStarted("1.1.1", "section", "s1", A, 1, 3.0),  # the near-duplicate re-ask
              NodeFailed("1.1.1", "section", "s1", A, 8, "HTTP 500", True, 4.0)):
        s.update(e)
    assert s.sections_done == {"1.1.1"} and not s.sections_failed and not s.nodes_failed
    assert s.inflight[A] == 0 and not s.active and s.tokens_written == 300
    # a re-ask that came back: its attempt is closed and the section is counted once
    s.update(NodeStarted("1.1.1", "section", "s1", A, 1, 5.0))
    s.update(NodeFinished("1.1.1", "section", "s1", reply(280), 6.0))
    assert s.sections_done == {"1.1.1"} and s.inflight[A] == 0 and s.tokens_written == 300


def test_a_brief_that_failed_is_no_failed_node_and_leaves_the_book_node_alone():
    s = JobState()
    for e in (NodeStarted("", "book", "Handbook", A, 1, 1.0),
              NodeStarted("brief", "brief", "Handbook", A, 1, 1.0),
              NodeFailed("brief", "brief", "Handbook", A, 2, "HTTP 500", True, 2.0)):
        s.update(e)
    assert not s.nodes_failed and "" in s.active  # the book node is still being planned
    assert s.plan_done == 0


def test_an_answer_our_check_refused_is_no_error_of_the_backends():
    # the backend answered; the planner could not use the list (or a section looped): asked again, counted apart
    s = JobState()
    for e in (NodeStarted("1", "part", "P", A, 1, 1.0),
              NodeFailed("1", "part", "P", A, 1, "unusable reply: 2 of 3 titles", False, 2.0, unusable=True),
              NodeStarted("1", "part", "P", A, 2, 2.5),
              NodeFailed("1", "part", "P", A, 2, "HTTP 500", False, 3.0)):
        s.update(e)
    assert s.errors == {A: 1} and s.unusable == 1 and s.retries == 2
    snap = s.snapshot()
    assert snap["unusable"] == 1 and snap["retries"] == 2
