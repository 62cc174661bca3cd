"""outline.md: the outline as plain Markdown a person reviews and edits between `handbook plan` and `write`.

::

    # Book title

    > The book's brief (optional): who the book is for, its voice, its running example and its terms;
    > every section request carries it (``--context outline``).

    ## Part title

    ### Chapter title

    - Section title
      words: 400
    - Section title

``> `` lines right under the book title, before the first part, are the book's brief: a person may edit or delete
it, and ``handbook write`` carries what is there (a bare ``>`` line, or a blank line, separates its paragraphs; an
older outline.md without one reads as it always did). One ``- `` (or ``* ``) line per section; an indented
``words: N`` line under a section overrides its length (the job's ``--words`` otherwise). Blank lines and HTML
comments (``<!-- ... -->``, on lines of their own) are ignored.
Anything else is an error naming its line: the file is a contract between a person and the fleet, and a line the
reader would drop silently is a section the person expected and will not get.

A hand-written parser rather than markdown-it: the format is line-based, and each error must name the line and say
what is wrong with it, which a token stream only approximates.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from .errors import ConfigError
from .osutil import atomic_write
from .outline import Chapter, Outline, Part, normal_brief

__all__ = [
    "FILENAME", "MAX_WORDS", "OutlineFileError", "edits_in", "read_outline_md", "render_outline_md", "write_outline_md",
]

FILENAME = "outline.md"
MAX_WORDS = 5_000  # a section longer than this is a chapter of its own: 20 x the usual length, and token cap

# a closing run of #s needs white space before it (CommonMark): "C#" is a title, "Rivers ##" is "Rivers"
_HEADING = re.compile(r"^(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")
_SECTION = re.compile(r"^[-*](?:\s+(.*?))?\s*$")
_WORDS = re.compile(r"^\s+words\s*:\s*(\S*)\s*$", re.IGNORECASE)
_BRIEF = re.compile(r"^ {0,3}>[ \t]?(.*)$")
BRIEF_WIDTH = 100  # a brief's lines are wrapped here for a person's editor; reading joins them again

_HEADER = (
    "<!-- The outline of this book. Edit it, then run `handbook write {dir}`.\n"
    "     # Book title / ## Part / ### Chapter / one '- Section title' line per section;\n"
    "     an indented 'words: N' line under a section sets its length; '> ' lines under the book title are its brief,\n"
    "     which every section request carries. Only changed sections are written again. -->\n"
)


class OutlineFileError(ConfigError):
    """A line of outline.md that cannot be read (exit 2)."""


def render_outline_md(outline: Outline, out_dir: str | Path = "DIR") -> str:
    lines = [_HEADER.format(dir=out_dir), f"# {outline.title}", ""]
    if outline.brief:
        for i, paragraph in enumerate(normal_brief(outline.brief).split("\n\n")):
            if i:
                lines.append(">")
            wrapped = textwrap.wrap(paragraph, BRIEF_WIDTH, break_long_words=False, break_on_hyphens=False)
            lines += [f"> {w}" for w in wrapped]
        lines.append("")
    for part in outline.parts:
        lines += [f"## {part.title}", ""]
        for chapter in part.chapters:
            lines += [f"### {chapter.title}", ""]
            for i, title in enumerate(chapter.sections):
                lines.append(f"- {title}")
                words = chapter.words_of(i)
                if words is not None:
                    lines.append(f"  words: {words}")
            lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write_outline_md(outline: Outline, out_dir: Path) -> Path:
    # a person may have it open: never a half-written file
    return atomic_write(out_dir / FILENAME, render_outline_md(outline, out_dir))


def edits_in(out_dir: Path, outline: Outline) -> tuple[bool, Outline | None]:
    """Does ``out_dir``/outline.md hold something other than ``outline`` (a person's edits), and which outline, when
    it can be read? No file: (False, None); a file that cannot be read: (True, None), since only a person makes one."""
    path = out_dir / FILENAME
    if not path.exists():
        return False, None
    try:
        mine = read_outline_md(path)
    except OutlineFileError:
        return True, None
    return mine != outline, mine


def read_outline_md(path: str | Path) -> Outline:
    """Parse an outline.md; :class:`OutlineFileError` names the file and line of the first problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not part of line 1
    except FileNotFoundError:
        raise OutlineFileError(f"{path}: no such file (run `handbook plan PROMPT --out {path.parent}` first)") from None
    except UnicodeDecodeError as e:
        raise OutlineFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise OutlineFileError(f"{path}: cannot read it: {e.strerror or e}") from None
    return _Reader(str(path)).read(text)


class _Reader:
    def __init__(self, name: str):
        self.name = name
        self.title: str | None = None
        self.parts: list[tuple[str, int, list[tuple[str, int, list[str], list[int | None]]]]] = []
        self.last_section_line: int | None = None
        self.brief: list[str] = []  # the brief's lines as read ("" between paragraphs)

    def fail(self, lineno: int, message: str) -> OutlineFileError:
        return OutlineFileError(f"{self.name}:{lineno}: {message}")

    def read(self, text: str) -> Outline:
        in_comment = 0
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.rstrip()
            if in_comment:
                if "-->" in line:
                    in_comment = 0
                continue
            if not line.strip():
                self.last_section_line = None if not raw.startswith((" ", "\t")) else self.last_section_line
                if self.brief and not self.parts:
                    self.brief.append("")  # a blank line ends a paragraph of the brief
                continue
            if line.lstrip().startswith("<!--"):
                if "-->" not in line:
                    in_comment = lineno
                continue
            self.line(lineno, line)
        if in_comment:
            raise self.fail(in_comment, "a comment opened here is never closed with -->")
        return self.outline()

    def line(self, lineno: int, line: str) -> None:
        if (m := _WORDS.match(line)) is not None:
            self.words(lineno, m.group(1))
            return
        self.last_section_line = None
        if (b := _BRIEF.match(line)) is not None:
            self.brief_line(lineno, b.group(1))
        elif (h := _HEADING.match(line)) is not None:
            self.heading(lineno, len(h.group(1)), (h.group(2) or "").strip())
        elif (s := _SECTION.match(line)) is not None:
            self.section(lineno, (s.group(1) or "").strip())
        else:
            raise self.fail(lineno, f"not an outline line: {line.strip()[:60]!r} (expected '# Book', '> brief', "
                                    "'## Part', '### Chapter', '- Section' or an indented 'words: N')")

    def brief_line(self, lineno: int, text: str) -> None:
        if self.title is None:
            raise self.fail(lineno, "a '> ' brief line before the book title: the brief goes right under "
                                    "'# Book title'")
        if self.parts:
            raise self.fail(lineno, "a '> ' brief line inside the outline: the brief goes under the book title, "
                                    "before the first '## Part'")
        self.brief.append(text.strip())

    def heading(self, lineno: int, level: int, title: str) -> None:
        what = {1: "the book", 2: "a part", 3: "a chapter"}.get(level)
        if what is None:
            raise self.fail(lineno, f"a level-{level} heading; the outline has only #, ## and ### (sections are "
                                    "'- ' lines)")
        if not title:
            raise self.fail(lineno, f"{what} has an empty title")
        if level == 1:
            if self.title is not None:
                raise self.fail(lineno, "a second book title ('# '): the outline has one")
            self.title = title
            return
        if self.title is None:
            raise self.fail(lineno, f"{what} before the book title: the first heading must be '# Book title'")
        if level == 2:
            self.parts.append((title, lineno, []))
        elif not self.parts:
            raise self.fail(lineno, "a chapter outside a part: put a '## Part' line above it")
        else:
            self.parts[-1][2].append((title, lineno, [], []))

    def section(self, lineno: int, title: str) -> None:
        if not title:
            raise self.fail(lineno, "a section has an empty title")
        if self.title is None or not self.parts or not self.parts[-1][2]:
            raise self.fail(lineno, "a section outside a chapter: put it under a '### Chapter' line")
        chapter = self.parts[-1][2][-1]
        chapter[2].append(title)
        chapter[3].append(None)
        self.last_section_line = lineno

    def words(self, lineno: int, value: str) -> None:
        if self.last_section_line is None or not self.parts or not self.parts[-1][2]:
            raise self.fail(lineno, "'words:' belongs on the line right under a '- Section' line")
        chapter = self.parts[-1][2][-1]
        if chapter[3][-1] is not None:
            raise self.fail(lineno, "a second 'words:' for the same section")
        try:
            n = int(value)
        except ValueError:
            raise self.fail(lineno, f"'words:' takes a whole number, not {value!r}") from None
        if not 1 <= n <= MAX_WORDS:
            raise self.fail(lineno, f"'words: {n}' is out of range (1 to {MAX_WORDS:,})")
        chapter[3][-1] = n

    def outline(self) -> Outline:
        if self.title is None:
            raise OutlineFileError(f"{self.name}:1: no book title: the outline starts with a '# Book title' line")
        if not self.parts:
            raise OutlineFileError(f"{self.name}: the outline has no part ('## Part title' lines)")
        parts = []
        for title, lineno, chapters in self.parts:
            if not chapters:
                raise self.fail(lineno, f"part {title!r} has no chapter ('### Chapter title' lines under it)")
            for ctitle, clineno, sections, _ in chapters:
                if not sections:
                    raise self.fail(clineno, f"chapter {ctitle!r} has no section ('- Section title' lines under it)")
            parts.append(Part(title, tuple(
                Chapter(ctitle, tuple(sections), tuple(words) if any(w is not None for w in words) else ())
                for ctitle, _, sections, words in chapters
            )))
        return Outline(self.title, tuple(parts), normal_brief("\n".join(self.brief)))
