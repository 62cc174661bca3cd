"""Markdown -> the book's structure and HTML: the pure, process-independent half of typesetting.

The book's Markdown has ``# Title``, ``## Part``, ``### Chapter``, ``#### Section`` at column 0; a section's own
headings sit at ``#####`` / ``######``. :func:`parse_book` splits it into a tree of :class:`Node` values by those
structural headings (fence-aware, so a ``## comment`` inside a code block stays code), and every node's body is
rendered on its own: an unclosed code fence in one section can never swallow the rest of the book.

Model output is untrusted. Rendering is CommonMark + tables with raw HTML disabled (it shows as text), links only
for http(s), mailto and in-document anchors, and images never become ``<img>``: only their alt text is shown, so
nothing is ever fetched on the content's behalf.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import jinja2
from markdown_it import MarkdownIt
from markupsafe import Markup

from ..book.fences import FENCE_OPEN, closes

__all__ = [
    "Node",
    "document_html",
    "highlight",
    "parse_book",
    "plain_text",
    "render_inline",
    "render_markdown",
    "render_nodes",
    "toc_entries",
]

# ---------------------------------------------------------------------------------------------------------------
# Structure

_HEADING = re.compile(r"^(#{1,4})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
# A structural heading that recovers from an unclosed fence (a section cut mid-code by the token cap) must look
# exactly like the ones the book's assembler writes: levels 2-4, alone between blank lines.
_RECOVER = re.compile(r"^#{2,4}[ \t]+\S")
_MARKDOWN_LANGS = frozenset({"md", "markdown", "commonmark", "gfm", "text", "txt", "rst", ""})

KIND = {1: "book", 2: "part", 3: "chapter", 4: "section"}
_ID_PREFIX = {2: "p", 3: "c", 4: "s"}


@dataclass
class Node:
    """One structural unit of the book: level 1 (the book), 2 (part), 3 (chapter) or 4 (section)."""

    level: int
    title: str  # inline Markdown
    id: str
    body: str = ""  # Markdown between this heading and the next structural heading
    children: list[Node] = field(default_factory=list)
    body_html: str = ""
    title_html: str = ""

    @property
    def kind(self) -> str:
        return KIND[self.level]

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def size(self) -> int:
        """Characters of Markdown under this node: the scheduler's cost estimate."""
        return len(self.body) + len(self.title) + sum(c.size() for c in self.children)

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level, "title": self.title, "id": self.id, "body": self.body,
            "children": [c.to_dict() for c in self.children],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        return cls(d["level"], d["title"], d["id"], d["body"], [cls.from_dict(c) for c in d["children"]])


def _split_lines(markdown: str) -> list[str]:
    return markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")


_Fence = tuple[str, str]  # an open code fence: (its mark, its language); the grammar is book/fences.py


def parse_book(markdown: str, default_title: str = "Handbook", before: tuple[int, int, int] = (0, 0, 0)) -> Node:
    """Split the book into its structural tree. The first ``#`` heading is the title; later ``#`` headings are
    treated as parts. Text before the first part (a preface) is the root's body. ``before``: the Markdown is a
    piece of a longer book, after that many parts, chapters of its part and sections of its chapter (its ids are
    then those the whole book gives it)."""
    lines = _split_lines(markdown)
    root = Node(1, default_title, "book")
    stack: list[Node] = [root]
    body: list[str] = []
    counters = [0, 0, *before]
    fence: _Fence | None = None
    seen_title = False

    for i, line in enumerate(lines):
        fence, code = _fence_step(lines, i, fence)
        if code:
            body.append(line)
            continue
        h = _HEADING.match(line)
        if not h:
            body.append(line)
            continue
        level = len(h.group(1))
        title = (h.group(2) or "").strip() or "(untitled)"
        if level == 1 and not seen_title and len(stack) == 1 and not any(s.strip() for s in body):
            seen_title = True
            root.title = title
            body.clear()
            continue
        stack[-1].body = "\n".join(body).strip("\n")
        body.clear()
        _open_node(stack, counters, max(level, 2), title)
    stack[-1].body = "\n".join(body).strip("\n")
    return root


def _fence_step(lines: list[str], i: int, fence: _Fence | None) -> tuple[_Fence | None, bool]:
    """The code fence open after line ``i`` (``fence``: the one open before it), and whether the line is code or
    a fence line (the body's, never a heading)."""
    line = lines[i]
    if fence is None:
        m = FENCE_OPEN.match(line)
        if m:
            info = m.group(3).strip().split()
            return (m.group(2), info[0].lower() if info else ""), True
        return None, False
    if closes(line, fence[0]):
        return None, True
    recover = (
        fence[1] not in _MARKDOWN_LANGS
        and _RECOVER.match(line)
        and i > 0 and not lines[i - 1].strip()
        and (i + 1 >= len(lines) or not lines[i + 1].strip())
    )
    if not recover:
        return fence, True
    return None, False  # the section was cut mid-code: the heading ends it


def _open_node(stack: list[Node], counters: list[int], level: int, title: str) -> None:
    """Start the structural node of a heading at ``level`` (2-4): numbered, and the child of the innermost open
    node above that level."""
    counters[level] += 1
    for deeper in range(level + 1, 5):
        counters[deeper] = 0
    node_id = _ID_PREFIX[level] + "-".join(str(c) for c in counters[2 : level + 1])
    node = Node(level, title, node_id)
    while stack[-1].level >= level:
        stack.pop()
    stack[-1].children.append(node)
    stack.append(node)


def toc_entries(root: Node) -> list[Node]:
    """Every part, chapter and section in reading order."""
    return [n for n in root.walk() if n.level > 1]


# ---------------------------------------------------------------------------------------------------------------
# Highlighting: few boxes. WeasyPrint pays for every inline box (measured: a keyword span costs about as much as a
# short line of prose), so code is coloured the "alabaster" way: comments, strings and the names that definitions
# introduce (def/class names), not every keyword. Neighbouring tokens of one class share a span, spaces join
# whatever run they are in, and no span crosses a line break.

_HL_CLASS_CACHE: dict[Any, str | None] = {}


def _hl_class(ttype) -> str | None:
    cls = _HL_CLASS_CACHE.get(ttype, "?")
    if cls != "?":
        return cls
    from pygments.token import Comment, Name, String

    if ttype in Comment:
        cls = "c"
    elif ttype in String:
        cls = "s"
    elif ttype in Name.Function or ttype in Name.Class or ttype in Name.Decorator:
        cls = "d"
    else:
        cls = None
    _HL_CLASS_CACHE[ttype] = cls
    return cls


_LANG_ALIASES = {"py": "python", "python3": "python", "sh": "bash", "shell": "bash", "console": "bash",
                 "js": "javascript", "ts": "typescript", "yml": "yaml"}


@lru_cache(maxsize=64)
def _lexer(lang: str):
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(_LANG_ALIASES.get(lang, lang), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def highlight(code: str, lang: str) -> str:
    """Escaped HTML of ``code``: one span per run of comment, string or definition-name tokens."""
    lexer = _lexer(lang.lower()) if lang else None
    if lexer is None or len(code) > 200_000:
        return html.escape(code, quote=False)
    out: list[str] = []
    run: list[str] = []
    run_cls: str | None = None
    for ttype, value in lexer.get_tokens(code):
        if not value:
            continue
        if value.isspace() and "\n" not in value:
            run.append(value)  # spaces join whatever run they are in
            continue
        cls = None if value.isspace() else _hl_class(ttype)  # a span never crosses a line break
        if cls != run_cls:
            if run:
                text = html.escape("".join(run), quote=False)
                out.append(f'<span class="{run_cls}">{text}</span>' if run_cls else text)
            run = []
            run_cls = cls
        run.append(value)
    if run:
        text = html.escape("".join(run), quote=False)
        out.append(f'<span class="{run_cls}">{text}</span>' if run_cls else text)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Markdown -> HTML

_SAFE_LINK = re.compile(r"^(?:https?://|mailto:|#)", re.IGNORECASE)


def _render_fence(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    info = token.info.strip().split()
    lang = info[0] if info else ""
    code = token.content
    code = code.removesuffix("\n")
    cls = f' class="lang-{html.escape(re.sub(r"[^A-Za-z0-9_+-]", "", lang), quote=True)}"' if lang else ""
    return f"<pre{cls}>{highlight(code, lang)}</pre>\n"


def _render_code_block(self, tokens, idx, options, env) -> str:
    code = tokens[idx].content
    code = code.removesuffix("\n")
    return f"<pre>{html.escape(code, quote=False)}</pre>\n"


def _render_image(self, tokens, idx, options, env) -> str:
    # Never an <img>: images in model output are not fetched. The alt text stands in for the picture.
    alt = self.renderInlineAsText(tokens[idx].children or [], options, env)
    return f'<span class="img">[{html.escape(alt or "image", quote=False)}]</span>'


def _render_ordered_list(self, tokens, idx, options, env) -> str:
    """<ol>, its indent fitted to its widest number, and its items numbered as written where that was deliberate.

    List markers hang in the indent, and a galley slice is clipped to the text box, so an <ol> whose widest number
    has 2 to 9 digits gets the class "n2" to "n9", which book.css indents by (digits + 1) x 0.65em (stop 40's demo
    printed "10." as "0."). CommonMark numbers a list from its first number on; where the numbers written rise
    (a timeline: "1969.", "1972.", "1989.") each item keeps its own (``<li value>``), where they do not ("1." on
    every item, the Markdown habit) the list counts up."""
    token = tokens[idx]
    start = token.attrGet("start")
    first = 1 if start is None else int(start)
    items = []
    for k in range(idx + 1, len(tokens)):  # an index loop: no copy of the rest of the document per list
        t = tokens[k]
        if t.level == token.level and t.type == "ordered_list_close":
            break
        if t.level == token.level + 1 and t.type == "list_item_open":
            items.append(t)
    written = [int(t.info) for t in items if t.info.isdigit()]
    numbers = list(range(first, first + len(items)))
    if len(written) == len(items) and written != numbers and all(a < b for a, b in pairwise(written)):
        numbers = written
        for t, n in zip(items, numbers, strict=True):
            t.attrSet("value", str(n))
    digits = len(str(max(numbers, default=first)))
    if digits >= 2:
        token.attrSet("class", f"n{min(digits, 9)}")
    return self.renderToken(tokens, idx, options, env)


@lru_cache(maxsize=1)
def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")
    md.validateLink = lambda url: bool(_SAFE_LINK.match(url.strip()))  # type: ignore[method-assign]
    md.add_render_rule("fence", _render_fence)
    md.add_render_rule("code_block", _render_code_block)
    md.add_render_rule("image", _render_image)
    md.add_render_rule("ordered_list_open", _render_ordered_list)
    return md


def render_markdown(text: str) -> str:
    if not text.strip():
        return ""
    return _md().render(text)


def render_inline(text: str) -> str:
    return _md().renderInline(text)


_TAG = re.compile(r"<[^>]*>")


def plain_text(inline_html: str) -> str:
    """Text of rendered inline HTML (for bookmarks and running heads)."""
    return html.unescape(_TAG.sub("", inline_html))


# ---------------------------------------------------------------------------------------------------------------
# The template


@lru_cache(maxsize=8)
def _template_env(template_dirs: tuple[str, ...]) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dirs),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
        lstrip_blocks=False,
    )


def template_env(template_dirs: list[str]) -> jinja2.Environment:
    """One Environment per list of directories (a worker lays out several chunks with the same templates)."""
    return _template_env(tuple(template_dirs))


def read_css(template_dirs: list[str]) -> str:
    for d in template_dirs:
        p = Path(d) / "book.css"
        if p.is_file():
            return p.read_text(encoding="utf-8")
    return ""


def render_nodes(nodes: list[Node]) -> None:
    """Fill title_html and body_html of every node (Markdown -> HTML, each body on its own)."""
    for top in nodes:
        for n in top.walk():
            n.title_html = Markup(render_inline(n.title))
            n.body_html = Markup(render_markdown(n.body))


def document_html(template_dirs: list[str], **context: Any) -> str:
    env = template_env(template_dirs)
    context.setdefault("css", Markup(read_css(template_dirs)))
    return env.get_template("book.html.j2").render(**context)
