"""Typesetting: structure, safety, and a real A5 PDF whose contents point at the pages where sections start."""

from __future__ import annotations

import argparse
import http.server
import random
import re
import subprocess
import threading
from typing import ClassVar

import pypdf
import pytest
import weasyprint  # noqa: F401  -- a dependency: missing, these tests fail at import (never skip)

from orchestrator.cli.typeset import add_arguments, run
from orchestrator.core.errors import ConfigError
from orchestrator.core.resources import bundled_templates
from orchestrator.typeset import TypesetInfo, typeset, typeset_to
from orchestrator.typeset.html import highlight, parse_book, render_inline, render_markdown
from orchestrator.typeset.pdf import WORKER_COMMAND, TypesetError, worker_env

A5 = (419.5, 595.3)
_WORDS = ["the", "service", "keeps", "its", "queue", "small", "because", "every", "request", "that", "waits", "costs", "memory", "and", "latency", "while", "the", "cache", "answers", "most", "reads", "so", "the", "database", "sees", "only", "writes", "and", "a", "few", "misses", "which", "we", "measure", "with", "metrics", "that", "alert", "the", "team", "before", "users", "notice"]

LONG_TOKEN = "averyveryverylongidentifier_" * 9  # ~250 characters, no break opportunity


def _para(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + "."


def small_book(parts: int = 2, chapters: int = 2, sections: int = 3) -> tuple[str, list[tuple[str, str, str]]]:
    """Markdown in the book's shape and the (path, kind, title) of every part, chapter and section."""
    rng = random.Random(7)
    out = ["# A Small Test Handbook", ""]
    heads = []
    for p in range(1, parts + 1):
        title = f"Part {p} Foundations of Testing"
        out += [f"## {title}", ""]
        heads.append((f"{p}", "part", title))
        for c in range(1, chapters + 1):
            title = f"Chapter {p}.{c} on Reliable Builds"
            out += [f"### {title}", ""]
            heads.append((f"{p}.{c}", "chapter", title))
            for s in range(1, sections + 1):
                title = f"Section {p}.{c}.{s} Queue Latency Budgets"
                out += [f"#### {title}", ""]
                heads.append((f"{p}.{c}.{s}", "section", title))
                for _ in range(rng.randint(2, 4)):
                    out += [_para(rng, rng.randint(60, 110)), ""]
                out += ["##### Example", "", "```python", "def handler(request):",
                        "    ## not a heading: a comment inside code", "    return request.body", "```", ""]
                if (p, c, s) == (1, 1, 2):
                    out += ["```text", LONG_TOKEN, "```", "", "| key | value |", "|---|---|", "| a | 1 |", ""]
                if (p, c, s) == (1, 2, 1):  # cut off mid-code by the token cap: the fence never closes
                    out += ["Then it stops:", "", "```python", "def unfinished(x):", "    return (", ""]
    return "\n".join(out), heads


# ---------------------------------------------------------------------------------------------------------------
# Structure and HTML (no WeasyPrint)


def test_parse_book_structure_and_fence_recovery():
    md, heads = small_book()
    root = parse_book(md)
    assert root.title == "A Small Test Handbook"
    nodes = [n for n in root.walk() if n.level > 1]
    assert [(n.kind, n.title) for n in nodes] == [(k, t) for _, k, t in heads]
    assert [n.id for n in nodes][:4] == ["p1", "c1-1", "s1-1-1", "s1-1-2"]
    s = next(n for n in nodes if n.id == "s1-1-1")
    assert "## not a heading" in s.body  # a '#' line inside a closed fence is code
    cut = next(n for n in nodes if n.id == "s1-2-1")
    assert cut.body.rstrip().endswith("return (")  # the unclosed fence ends with its section
    assert next(n for n in nodes if n.id == "s1-2-2").title.startswith("Section 1.2.2")


def test_markdown_fences_do_not_recover_headings():
    md = "# T\n\n## P\n\n### C\n\n#### S\n\n```markdown\n\n## Inside\n\n```\n\nAfter.\n"
    root = parse_book(md)
    assert [n.title for n in root.walk()] == ["T", "P", "C", "S"]


def test_untitled_and_partless_books():
    root = parse_book("Some preface.\n\n### Chapter only\n\n#### S1\n\ntext\n", default_title="Fallback")
    assert root.title == "Fallback" and root.body == "Some preface."
    assert [n.id for n in root.walk()][1:] == ["c0-1", "s0-1-1"]


def test_untrusted_markdown_renders_safely():
    html = render_markdown(
        "<script>alert(1)</script>\n\n![x](file:///etc/passwd) ![y](http://127.0.0.1:9/y.png)\n\n"
        "[js](javascript:alert(1)) [f](file:///etc/passwd) [ok](https://example.org/a) [here](#s1-1-1)\n\n"
        '<img src="http://127.0.0.1:9/z.png">\n'
    )
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img" in html
    assert "![x](file:///etc/passwd)" in html  # a file: URL is no link at all: the Markdown shows as text
    assert '<span class="img">[y]</span>' in html  # any other image shows as its alt text
    assert 'href="javascript' not in html and 'href="file' not in html
    assert 'href="https://example.org/a"' in html and 'href="#s1-1-1"' in html
    assert render_inline("Title <b>x</b>") == "Title &lt;b&gt;x&lt;/b&gt;"


def test_highlight_uses_few_spans():
    code = 'def f(x):\n    # note\n    return "a" + "b" if x else None\n'
    out = highlight(code, "python")
    assert out.count("<span") <= 7
    assert '<span class="c"># note</span>' in out
    assert "&lt;" not in highlight("x = 1", "python") and highlight("a < b", "nolanguage") == "a &lt; b"


def test_template_dir_finds_the_bundled_templates():
    d = bundled_templates()
    assert (d / "book.html.j2").is_file() and (d / "book.css").is_file()


def test_asset_fetcher_serves_only_our_assets(tmp_path):
    from orchestrator.typeset.worker import ASSET_BASE, AssetFetcher

    (tmp_path / "logo.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    f = AssetFetcher([str(tmp_path)])
    assert f(ASSET_BASE + "logo.svg").read().startswith(b"<svg")
    for url in ("file:///etc/passwd", "http://127.0.0.1:9/x.png", "https://example.org/", "data:text/plain,hi",
                ASSET_BASE + "../../../../etc/passwd", ASSET_BASE + "missing.css"):
        with pytest.raises(ValueError):
            f(url)
    assert len(f.refused) == 6


# ---------------------------------------------------------------------------------------------------------------
# A real PDF


@pytest.fixture(scope="module")
def book_pdf(tmp_path_factory):
    md, heads = small_book()
    out = tmp_path_factory.mktemp("book")
    info = typeset(md, out, formats=("md", "html", "pdf"), workers=2)
    return info, heads, pypdf.PdfReader(str(info.pdf_path))


def _norm(text: str) -> str:
    return " ".join(text.split())


def test_typeset_writes_a5_pdf_and_html(book_pdf):
    info, heads, reader = book_pdf
    assert isinstance(info, TypesetInfo)
    assert info.pdf_path.name == "book.pdf" and info.html_path.name == "book.html"
    assert info.pdf_pages == len(reader.pages) > 10
    assert info.sections == sum(1 for _, k, _ in heads if k == "section")
    for page in reader.pages:
        box = page.mediabox
        assert abs(float(box.width) - A5[0]) < 0.5 and abs(float(box.height) - A5[1]) < 0.5
    html = info.html_path.read_text()
    assert "<style>" in html and "@page" in html  # self-contained
    assert html.count('<p class="toc-section"><a href="#s') == info.sections
    for _, _, title in heads:
        assert title in html


def test_every_heading_is_in_the_pdf_text(book_pdf):
    _, heads, reader = book_pdf
    text = _norm(" ".join(p.extract_text() for p in reader.pages))
    for _, _, title in heads:
        assert title in text
    assert "A Small Test Handbook" in text


def _contents(reader) -> list[tuple[str, int]]:
    """(title, printed page) for every line of the contents, read back from the PDF's text."""
    entries = []
    for page in reader.pages[1:6]:
        for line in page.extract_text(extraction_mode="layout").splitlines():
            m = re.match(r"^\s*(\S.*?\S)\s{2,}(\d+)\s*$", line)
            if m:
                entries.append((m.group(1), int(m.group(2))))
    return entries


def test_contents_numbers_are_where_sections_start(book_pdf):
    _, heads, reader = book_pdf
    entries = _contents(reader)
    assert [t for t, _ in entries] == [t for _, _, t in heads]
    texts = [_norm(p.extract_text()) for p in reader.pages]
    toc_pages = {i for i, t in enumerate(texts) if "Contents" in t[:40]}
    first_body = max(toc_pages) + 1
    numbers = [n for _, n in entries]
    assert numbers == sorted(numbers) and numbers[0] == first_body + 1  # the first part opens the body
    for title, number in entries:
        assert title in texts[number - 1], f"{title!r} not on page {number}"
        earlier = [i + 1 for i in range(first_body, number - 1) if title in texts[i]]
        assert not earlier, f"{title!r} already on page(s) {earlier} before {number}"
    for i, t in enumerate(texts[1:], start=2):  # footer numbers on every page but the title page
        assert re.search(rf"(^|\s){i}(\s|$)", t), f"no page number {i}"


def test_contents_link_to_their_pages_and_bookmarks_exist(book_pdf):
    _, heads, reader = book_pdf
    entries = _contents(reader)
    links = []
    for page in reader.pages[1:6]:
        for a in page.get("/Annots") or []:
            a = a.get_object()
            if a.get("/Subtype") == "/Link" and "/Dest" in a:
                links.append(reader.get_page_number(a["/Dest"][0].get_object()) + 1)
    assert links == [n for _, n in entries]
    outline = reader.outline
    assert outline[0].title == "Contents" and outline[1].title == heads[0][2]


def test_running_head_and_parts_on_new_pages(book_pdf):
    _, heads, reader = book_pdf
    texts = [_norm(p.extract_text()) for p in reader.pages]
    numbers = dict(_contents(reader))
    for _, kind, title in heads:
        if kind == "part":
            page = texts[numbers[title] - 1]
            assert page.startswith(title), page[:200]  # a part opens its own page: nothing above its title
    chapter = "Chapter 1.1 on Reliable Builds"
    later = numbers["Section 1.1.3 Queue Latency Budgets"]
    assert later > numbers[chapter] and chapter in texts[later - 1]  # the running head


def test_long_code_wraps_inside_the_page(book_pdf):
    _, _, reader = book_pdf
    number = dict(_contents(reader))["Section 1.1.2 Queue Latency Budgets"]
    right_edges = []

    def visit(text, cm, tm, font, size):  # monospaced runs: 0.602 em per character (DejaVu Sans Mono)
        if text.strip() and font is not None and "Mono" in str(font.get("/BaseFont", "")):
            x = tm[4] * cm[0] + tm[5] * cm[2] + cm[4]
            right_edges.append(x + len(text.rstrip("\n")) * 0.602 * size * abs(tm[0] * cm[0]))

    for i in (number - 1, number):
        reader.pages[i].extract_text(visitor_text=visit)
    text = "".join(_norm(reader.pages[i].extract_text()) for i in (number - 1, number))
    assert LONG_TOKEN not in text  # not one unbroken run...
    assert LONG_TOKEN[:40] in text and LONG_TOKEN[-40:] in text  # ...but all there
    assert len(right_edges) > 5 and max(right_edges) < A5[0]


# ---------------------------------------------------------------------------------------------------------------
# Hostile content


class _Recorder(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self):
        _Recorder.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_hostile_book_fetches_nothing(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        md = "\n".join([
            "# Hostile", "", "## Part", "", "### Chapter", "", "#### Section one", "",
            "![x](file:///etc/passwd)", "",
            "<script>alert(1)</script>", "",
            f"![pixel]({base}/image.png)", "",
            f'<img src="{base}/raw.png"> <link rel="stylesheet" href="{base}/x.css">', "",
            f"<style>@import url({base}/import.css); body {{ background: url({base}/bg.png) }}</style>", "",
            f"[a link]({base}/link) and <{base}/autolink>", "",
            "#### Section two", "", "Plain text.", "",
        ])
        info = typeset(md, tmp_path, formats=("html", "pdf"), workers=1)
        text = _norm(" ".join(p.extract_text() for p in pypdf.PdfReader(str(info.pdf_path)).pages))
    finally:
        server.shutdown()
        server.server_close()
    assert _Recorder.hits == []  # the server saw no request
    assert "root:" not in text and "/bin/bash" not in text and "/usr/sbin" not in text
    assert "<script>alert(1)</script>" in text  # raw HTML shows as text
    assert "[pixel]" in text and "![x](file:///etc/passwd)" in text
    html = info.html_path.read_text()
    assert "<script" not in html and "<img" not in html and "<link" not in html.split("</head>")[1]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "Section two" in text


# ---------------------------------------------------------------------------------------------------------------
# The command line and failures


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        run(_args(str(tmp_path / "missing.md")))
    empty = tmp_path / "empty.md"
    empty.write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        run(_args(str(empty)))
    book = tmp_path / "b.md"
    book.write_text("# B\n\n## P\n\ntext\n")
    with pytest.raises(ConfigError, match="unknown format"):
        run(_args(str(book), "--format", "docx"))
    with pytest.raises(ConfigError, match="--templates"):
        run(_args(str(book), "--templates", str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match=r"\.pdf"):
        run(_args(str(book), "--out", str(tmp_path / "x.txt")))


def test_cli_html_with_template_override(tmp_path, capsys):
    book = tmp_path / "my_book.md"
    book.write_text("Intro words.\n\n## Part A\n\n### Ch\n\n#### S\n\nBody.\n")
    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / "book.css").write_text("/* custom-css-marker */ body { color: #123456 }")
    assert run(_args(str(book), "--format", "md,html", "--templates", str(tpl))) == 0
    html = (tmp_path / "my_book.html").read_text()
    assert "custom-css-marker" in html and "<title>my book</title>" in html
    assert "Intro words." in html
    assert not (tmp_path / "my_book.pdf").exists()
    assert "wrote" in capsys.readouterr().out


def test_worker_failure_is_reported(tmp_path):
    tpl = tmp_path / "tpl"
    tpl.mkdir()
    (tpl / "book.html.j2").write_text("{{ no_such_variable }}")
    with pytest.raises(TypesetError, match="failed"):
        typeset_to("# B\n\n## P\n\ntext\n", pdf_path=tmp_path / "b.pdf", html_path=None, templates=tpl, workers=1)
    assert not (tmp_path / "b.pdf").exists()


# ---------------------------------------------------------------------------------------------------------------
# The worker process


def test_workers_ignore_an_orchestrator_in_the_working_directory(tmp_path, monkeypatch):
    shadow = tmp_path / "orchestrator"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('a different orchestrator was imported')\n")
    monkeypatch.chdir(tmp_path)
    info = typeset("# B\n\n## P\n\n### C\n\n#### S\n\ntext\n", tmp_path / "out", workers=1)
    assert info.pdf_pages == len(pypdf.PdfReader(str(info.pdf_path)).pages) >= 3


def test_the_worker_loads_no_job_machinery(tmp_path):
    # The worker's own imports, in the interpreter and environment a real worker gets: no terminal UI, HTTP
    # client or event loop (the package's lazy __init__), and no pypdf (only the parent merges).
    probe = "import sys, orchestrator.typeset.worker; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([*WORKER_COMMAND[:2], "-c", probe], env=worker_env(), cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert "weasyprint" in out
    for heavy in ("rich", "aiohttp", "anyio", "openai", "pypdf", "orchestrator.job.run", "orchestrator.wire.client"):
        assert heavy not in out


def test_numbered_lists_keep_their_numbers_and_every_marker_stays_on_the_page(tmp_path):
    # SmolLM2-135M's "10. **Test Automation**" printed as "0." in stop 40's demo (the "1" of a two-digit marker was cut
    # off at the text's left edge), and steps resumed after a code block ("4." in book.md) printed from "1." again.
    steps = "\n".join(f"{i}. **Step {i}**: do the thing number {i}." for i in range(1, 13))
    resumed = "1. Install it.\n2. Configure it.\n3. Start it.\n\n```sh\nmake run\n```\n\n4. Run the tests.\n5. Ship it."
    hundred = "\n".join(f"{i}. Entry {i}." for i in range(99, 103))
    years = "1969. The landing.\n1972. The last walk.\n1989. A probe to Neptune."  # numbers as written: they rise
    lazy = "1. One.\n1. Two.\n1. Three."  # the Markdown habit: counted up
    word = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 2  # wider than the text box
    md = (f"# Lists\n\n## Part One\n\n### Chapter One\n\n#### Numbered\n\nTwelve steps:\n\n{steps}\n\nResumed:\n\n"
          f"{resumed}\n\nFrom 99:\n\n{hundred}\n\nYears:\n\n{years}\n\nLazy:\n\n{lazy}\n\n"
          f"Nine:\n\n123456789. Nine digits.\n\nA word: {word} ends here.\n")
    assert '<ol class="n2">' in render_markdown(steps) and '<ol start="99" class="n3">' in render_markdown(hundred)
    assert "<ol>" in render_markdown("1. One.\n2. Two.\n")  # a short list keeps the narrow indent
    assert '<li value="1972">' in render_markdown(years) and "value=" not in render_markdown(lazy)
    info = typeset(md, tmp_path, formats=("pdf",), workers=1)
    runs: list[tuple[str, float]] = []

    def visit(text, cm, tm, _font, _size):
        if text.strip():
            runs.append((text.strip(), tm[4] * cm[0] + cm[4]))

    for page in pypdf.PdfReader(str(info.pdf_path)).pages[3:]:  # the body, after the title page and contents
        page.extract_text(visitor_text=visit)
    left = next(x for t, x in runs if t.startswith("Twelve steps"))  # where the text column begins
    markers = [(t, x) for t, x in runs if re.fullmatch(r"\d+\.", t)]  # drawn after the items' text, in order
    assert [t for t, _ in markers] == [f"{i}." for i in (*range(1, 13), 1, 2, 3, 4, 5, *range(99, 103), 1969, 1972,
                                                          1989, 1, 2, 3, 123456789)]
    assert all(x >= left - 0.1 for _, x in markers), [m for m in markers if m[1] < left - 0.1]
    # a word wider than the text box breaks at its edge rather than running past it (where it would be clipped)
    assert not any(word in t for t, _ in runs) and any(t.startswith(word[:40]) for t, _ in runs)
