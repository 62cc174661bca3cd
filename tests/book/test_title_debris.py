"""Title debris: what the title gate (the planner's and the quality checker's, book/checks.title_debris) refuses, and
the real titles it must let through."""

from __future__ import annotations

import pytest

from orchestrator.book.checks import title_debris

BOOK = "Software Engineering Handbook"

DEBRIS = [  # (title, why it is debris)
    ("Title: Software Engineering Handbook", "prompt words"), ("items", "prompt words"), ("JSON", "prompt words"),
    ("book.pdf", "a file name"), ("Software Engineering Handbook. 5.5", "numbering"),
    ("2023-01-15T02:43:10+00:00 (In 2022-01-023)", "a date"),
    ("Items: [1] Title: Software Engineering Handbook", "prompt words"), ("in reading order", "prompt words"),
    ('{"title": "x"', "markup"), ("5.5", "no letters"), ("Section 3", "a placeholder"),
    ("1. Introduction", "numbering"), ("Testing (2)", "numbering"), ("Chapter 3: Testing", "numbering"),
    ("**Testing**", "markup"), ("# Testing", "markup"), ("<b>Testing</b>", "markup"),
    ("Here are the section titles:", "a fragment"), ("Software Engineering Handbook", "a copy"),
    ("Notes from 12:30", "a date"),
    ("Use color effectively (https://www.codyandbrian.com/data-visualization)", "a web address"),
    ("See www.example.org for Charts", "a web address"),
    ("A title that goes on and on for far more words than any heading in a book ever should", "over 12 words"),
    # SmolLM2-135M's lists (stop 42): a line that stops on a dash, a word caught in a loop
    ("What is it (and other) -", "a fragment"), ("Error Handling (", "a fragment"), ("Testing &", "a fragment"),
    ("Testing +", "a fragment"), ("Europe—", "a fragment"),
    ("The Nile: Its Sacred Sacred Sacred Mosi_Mine", "a word three times"),
]

TITLES = ["Version Control", "Branching Strategies", "Unit Testing with pytest", "CI/CD Pipelines", "Big-O Notation",
          "HTTP/2 and gRPC", "The 12-Factor App", "Python 3.12 Features", "10 Habits of Effective Reviewers",
          "Configuring pyproject.toml", "Node.js Event Loops", "C# for Java Developers", "Parsing JSON Safely",
          ".NET Dependency Injection", "Understanding __init__ and __new__", "Request -> Response Flow", "Markdown",
          "HTTP Caching with ETags", "The World Wide Web", "Pros & Cons of Microservices", "Tora! Tora! Tora!",
          "Go Go Gadgets", "Input/Output in C", "Test - Driven Design", "C++", "Headings (H1 to H6)",
          "Location Location Location", "Ho Ho Ho: Holiday Cookies", "Britain Since 1945–", "Inside /proc/",
          "Q&A", "TCP/IP", "R&D Budgets"]


@pytest.mark.parametrize(("title", "why"), DEBRIS)
def test_title_debris_is_rejected(title, why):
    assert title_debris(title, (BOOK,)).startswith(why)


@pytest.mark.parametrize("title", TITLES)
def test_good_titles_pass(title):
    assert title_debris(title, (BOOK, "Tools")) is None


def test_title_debris_copies_and_repeats():
    assert "copy" in title_debris("testing", (BOOK, "Testing"))
    assert "repeat" in title_debris("Unit Tests", (BOOK,), ("Mocks", "unit tests!"))
    assert title_debris("Unit Tests", (BOOK,), ("Mocks",)) is None
