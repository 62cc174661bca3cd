"""A library's FILE (``handbook library FILE``), read lazily: one book a line, checked line by line.

FILE is JSONL (``{"prompt": ..., "id": ..., "parts": 2, ...}`` a line) when its first non-blank line starts with
``{``, else plain text with one prompt a line; blank lines are skipped in both. Every error is one line,
``FILE:LINE: what`` (a ConfigError: exit 2), and :func:`check_file` finds the first one before any request is sent.

Memory: the lines are streamed, never held. What is held is one 64-bit digest per book id for the duplicate check,
in a flat array (:class:`DigestSet`: 11 to 21 bytes a line, 32 at the moment it grows; under 40 MB for a million
books, where a Python set of ints would take about 90 MB; tests/job/test_library_input.py measures it). A digest
seen twice is confirmed by reading the file again up to that line, which also names the first line of the pair; a
64-bit collision (about 1 in 10^7 for a million ids) costs that rescan and nothing else. :func:`iter_books` over a
shard holds the digests of its own shard only.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import typing
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..core.config import JOB_KEYS, SETTING_NAMES, Settings, settings_from, slugify
from ..core.errors import ConfigError
from ..core.settings_types import show_value

__all__ = ["BOOK_KEYS", "PER_BOOK_SETTINGS", "DigestSet", "LibraryBook", "LibrarySummary", "book_key", "check_file",
           "derive_id", "id_digest", "iter_books", "parse_shard", "shard_of"]

# The settings one line may set: what the book is (its shape, lengths, how the model is asked). The rest is the run's
# or the fleet's and comes from the command line only: backends, caps, model, api_key, timeouts, attempts, pipeline,
# formats, templates (book.html's too), budgets (pages, minutes, ladder, forecast: they probe the fleet), timeline,
# typeset_while_writing.
PER_BOOK_SETTINGS = frozenset({
    "parts", "chapters", "sections", "words", "max_tokens", "plan_max_tokens", "temperature", "top_p",
    "repetition_penalty", "frequency_penalty", "profile", "system", "planning", "finish_truncated",
})
assert PER_BOOK_SETTINGS <= SETTING_NAMES
BOOK_KEYS = PER_BOOK_SETTINGS | {"prompt", "id"}
_SINGLE_BOOK = frozenset({"pages", "minutes", "preset", "timeline"})  # a single job's, which a library refuses

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ID_RULE = "letters, digits, '.', '_' and '-', at most 100, the first a letter or digit, no '..'"
# the float settings: 0 and 0.0 are the same temperature, so the key writes both as 0.0
_FLOATS = frozenset(n for n, t in typing.get_type_hints(Settings).items() if float in (t, *typing.get_args(t)))
_CACHE_MAX = 512  # distinct per-book override sets whose merged Settings are kept (most libraries have a few)
# (name, type, value) of a line's settings -> (merged Settings, their key's JSON); () is the run's own settings
_Cache = dict[tuple[tuple[str, str, Any], ...] | None, tuple[Settings, bytes]]


@dataclass(frozen=True)
class LibraryBook:
    """One line of the library. ``overrides``: the settings the line sets (None values dropped); ``settings``: the
    run's settings with them applied; ``key``: :func:`book_key` (a changed prompt or setting is a changed book)."""

    id: str
    line: int
    prompt: str
    overrides: dict[str, Any]
    settings: Settings
    key: str


@dataclass(frozen=True)
class LibrarySummary:
    """What :func:`check_file` found: ``books`` in the file, ``in_shard`` of them in ``shard`` (all without one)."""

    path: str
    format: str  # "jsonl" or "text"
    books: int
    in_shard: int
    shard: tuple[int, int] | None = None


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` (``--shard``) -> (I, N): this host takes the books whose :func:`shard_of` is I, of N hosts."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec) if isinstance(spec, str) else None
    if m is None:
        raise ConfigError(f"--shard expects I/N (this host's number I of N hosts, e.g. 0/4), got {spec!r}")
    i, n = int(m[1]), int(m[2])
    if n < 1 or i >= n:
        raise ConfigError(f"--shard {spec.strip()}: I must be from 0 to N-1 and N at least 1 (e.g. 0/{max(n, 2)})")
    return i, n


def shard_of(book_id: str, n: int) -> int:
    """The shard (0..n-1) of a book: sha256 of its id, case folded (ids that differ in case only are one folder on
    a case-insensitive file system, so they fall in one shard, where the duplicate check sees both). Stable across
    hosts, processes and Python versions, so N hosts split one library without talking to each other."""
    if n < 1:
        raise ValueError(f"shard count must be at least 1, got {n}")
    return int.from_bytes(hashlib.sha256(book_id.lower().encode()).digest()[:8], "big") % n


def derive_id(prompt: str) -> str:
    """The id of a line that gives none: the slug of the prompt's first 160 characters, cut to 40 (the slug of a
    long prompt is not read past that), and 8 hex of the whole prompt's sha256. It depends on the prompt only, so
    appending lines, reordering them or changing a line's settings renames no book."""
    return f"{slugify(prompt[:160], 40)}-{hashlib.sha256(prompt.encode()).hexdigest()[:8]}"


def book_key(prompt: str, settings: Settings) -> str:
    """A stable digest of what decides a book's text: the prompt and ``settings.resume_key()`` (the settings a
    journal must share to be resumed; the model is checked apart, once the backends name it). 32 hex."""
    return _key(prompt, _settings_blob(settings))


# Settings that change a book's text without being in resume_key (a single book's journal follows them section by
# section: handbook write may change them), each with the value the reference's way has: a key holds one only where
# it differs, so a library made the reference's way before they existed keeps its keys (and its books).
_TEXT_SETTINGS = {"context": "none", "distinct_titles": False, "repairs": False, "finish_truncated": False}


def _settings_blob(settings: Settings) -> bytes:
    """``settings.resume_key()`` and the :data:`_TEXT_SETTINGS` that differ from the reference's, as canonical JSON
    (sorted keys; a float setting given as 0 written as 0.0)."""
    key = {k: float(v) if k in _FLOATS and isinstance(v, int) and not isinstance(v, bool) else v
           for k, v in settings.resume_key().items()}
    key.update({k: getattr(settings, k) for k, ref in _TEXT_SETTINGS.items() if getattr(settings, k) != ref})
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)


def _key(prompt: str, blob: bytes) -> str:
    return hashlib.sha256(blob + b"\n" + prompt.encode()).hexdigest()[:32]


def check_file(path: str | Path, base: Settings, shard: tuple[int, int] | None = None) -> LibrarySummary:
    """Check every line of FILE (before the first request): the first bad line is a one-line ConfigError
    ``FILE:LINE: ...``; a file with no book in it is one too. Returns the counts."""
    fmt = _detect(Path(path))
    seen = _Seen(Path(path), fmt)
    books = in_shard = 0
    for book in _scan(Path(path), base, fmt):
        seen.add(book)
        books += 1
        in_shard += shard is None or shard_of(book.id, shard[1]) == shard[0]
    return LibrarySummary(str(path), fmt, books, in_shard, shard)


def iter_books(path: str | Path, base: Settings, shard: tuple[int, int] | None = None) -> Iterator[LibraryBook]:
    """The books of FILE (of ``shard`` only, when given), in file order, read as they are asked for. Each line is
    checked as in :func:`check_file` (call that first: it finds a bad line before any work starts), but a line of
    another shard only as far as its id needs."""
    p = Path(path)
    fmt = _detect(p)
    seen = _Seen(p, fmt)
    for book in _scan(p, base, fmt, shard):
        seen.add(book)
        yield book


def _error(path: Path, line: int, message: str) -> ConfigError:
    return ConfigError(f"{path}:{line}: {message}")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line, decoded one at a time (a bad byte names its line)."""
    try:
        fh = open(path, "rb")  # closed by the with below, also when the caller stops early
    except OSError as e:
        raise ConfigError(f"cannot read library file {path}: {e.strerror or e}") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _error(path, n, f"not UTF-8 text (byte {e.start + 1} of the line)") from None
            if n == 1:
                text = text.removeprefix("\ufeff")
            if text.strip():
                yield n, text


def _detect(path: Path) -> str:
    """"jsonl" when the first non-blank line starts with ``{``, else "text"; no book line at all is an error."""
    for _, text in _lines(path):
        return "jsonl" if text.lstrip().startswith("{") else "text"
    raise ConfigError(f"{path}: no books in the library file (every line is blank)")


def _scan(path: Path, base: Settings, fmt: str, shard: tuple[int, int] | None = None) -> Iterator[LibraryBook]:
    """Every book line of the file, checked, or those of ``shard`` only (the others checked as far as their id)."""
    cache: _Cache = {(): (base, _settings_blob(base))}
    for n, text in _lines(path):
        if fmt == "text":
            prompt = text.strip()
            book_id = derive_id(prompt)
            if shard is None or shard_of(book_id, shard[1]) == shard[0]:
                yield LibraryBook(book_id, n, prompt, {}, base, _key(prompt, cache[()][1]))
            continue
        obj = _object(path, n, text)
        prompt = _prompt(path, n, obj)
        book_id = _id(path, n, obj) or derive_id(prompt)
        if shard is not None and shard_of(book_id, shard[1]) != shard[0]:
            continue
        overrides = {k: v for k, v in obj.items() if k in PER_BOOK_SETTINGS and v is not None}
        settings, blob = _settings(path, n, overrides, base, cache)
        yield LibraryBook(book_id, n, prompt, overrides, settings, _key(prompt, blob))


def _object(path: Path, n: int, text: str) -> dict[str, Any]:
    """The line's JSON object, its keys checked against :data:`BOOK_KEYS`."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        why = re.sub(r":? ?line \d+ column (\d+) \(char \d+\)", r" at column \1", str(e))
        raise _error(path, n, f"not JSON: {why}") from None
    if not isinstance(obj, dict):
        raise _error(path, n, f'expected a JSON object such as {{"prompt": "..."}}, got {show_value(obj, False)}')
    for key in obj:
        if key in BOOK_KEYS:
            continue
        if key in _SINGLE_BOOK:
            raise _error(path, n, f"{key!r} chooses a single book's shape: a library line sets its shape itself "
                                  f"(a line may set {', '.join(sorted(BOOK_KEYS))})")
        if key in JOB_KEYS:
            raise _error(path, n, f"{key!r} is a setting of the whole run, not of one book: give it on the command "
                                  f"line (a line may set {', '.join(sorted(BOOK_KEYS))})")
        near = difflib.get_close_matches(key, sorted(BOOK_KEYS), n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"a line may set {', '.join(sorted(BOOK_KEYS))}"
        raise _error(path, n, f"unknown key {key!r} ({hint})")
    return obj


def _prompt(path: Path, n: int, obj: dict[str, Any]) -> str:
    if "prompt" not in obj:
        raise _error(path, n, 'no "prompt"')
    prompt = obj["prompt"]
    if not isinstance(prompt, str):
        raise _error(path, n, f"'prompt': expected text (a str), got {show_value(prompt, False)}")
    if not prompt.strip():
        raise _error(path, n, "empty prompt")
    return prompt.strip()


def _id(path: Path, n: int, obj: dict[str, Any]) -> str | None:
    """The line's own id, checked to be safe as a folder name (books/<id>/), or None when it gives none."""
    value = obj.get("id")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _error(path, n, f"'id': expected text (a str), got {show_value(value, False)}")
    if not _ID.fullmatch(value) or ".." in value:
        raise _error(path, n, f"id {value[:60]!r} cannot name a folder: use {_ID_RULE}")
    return value


def _settings(path: Path, n: int, overrides: dict[str, Any], base: Settings,
              cache: _Cache) -> tuple[Settings, bytes]:
    """``base`` with the line's settings, and their key's JSON; the same overrides give the same (cached) pair,
    checked once. (True == 1 in a dict key: the type goes into the cache key, so "parts": true is still checked.)"""
    key: tuple[tuple[str, str, Any], ...] | None
    try:
        key = tuple(sorted((k, type(v).__name__, v) for k, v in overrides.items()))
        hash(key)
    except TypeError:  # a list or an object where a number belongs: not cacheable, and wrong (settings_from says)
        key = None
    cached = cache.get(key) if key is not None else None
    if cached is not None:
        return cached
    try:
        settings = settings_from(overrides, base)
    except ConfigError as e:
        raise _error(path, n, str(e)) from None
    pair = settings, _settings_blob(settings)
    if key is not None:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
            cache[()] = (base, _settings_blob(base))
        cache[key] = pair
    return pair


class _Seen:
    """The ids met so far, as 64-bit digests of the case-folded id; a digest met twice is checked by reading the
    file again up to that line, so the error names both lines and a digest collision passes."""

    def __init__(self, path: Path, fmt: str):
        self.path, self.fmt = path, fmt
        self.digests = DigestSet()

    def add(self, book: LibraryBook) -> None:
        folded = book.id.lower()
        if not self.digests.add(id_digest(folded)):
            first = self._first_line(folded, book.line)
            if first is not None:
                raise _error(self.path, book.line, self._message(book, first))

    def _first_line(self, folded: str, before: int) -> tuple[int, str] | None:
        for n, text in _lines(self.path):
            if n >= before:
                return None
            if self.fmt == "text":
                other = derive_id(text.strip())
            else:  # every line before ``before`` was checked already: the parts needed are known good
                obj = orjson.loads(text)
                other = obj.get("id") or derive_id(obj["prompt"].strip())
            if other.lower() == folded:
                return n, other
        return None

    @staticmethod
    def _message(book: LibraryBook, first: tuple[int, str]) -> str:
        line, other = first
        if other != book.id:
            return (f"id {book.id!r} is the same folder as {other!r} of line {line} on a case-insensitive file "
                    "system: give one of them another id")
        if book.id == derive_id(book.prompt):
            return (f"duplicate id {book.id!r} (first on line {line}): the same prompt twice; give one of the lines "
                    'an "id" of its own')
        return f"duplicate id {book.id!r} (first on line {line})"


def id_digest(folded_id: str) -> int:
    """64 bits of blake2b of a case-folded id, never 0 (the empty slot of :class:`DigestSet`)."""
    return int.from_bytes(hashlib.blake2b(folded_id.encode(), digest_size=8).digest(), "little") or 1


class DigestSet:
    """A set of nonzero 64-bit digests in one ``array("Q")``, open addressing with linear probing, at most 3/4 full:
    8 bytes a slot, 11 to 21 bytes a digest (32 while growing), where a Python set of ints costs about 90."""

    def __init__(self) -> None:
        self.slots = array("Q", [0]) * 1024
        self.count = 0

    def add(self, digest: int) -> bool:
        """Put ``digest`` in; False when it was in already."""
        slots, mask = self.slots, len(self.slots) - 1
        i = digest & mask
        while (held := slots[i]) != 0:
            if held == digest:
                return False
            i = (i + 1) & mask
        slots[i] = digest
        self.count += 1
        if self.count * 4 > len(slots) * 3:
            self._grow()
        return True

    def _grow(self) -> None:
        old, self.slots, self.count = self.slots, array("Q", [0]) * (2 * len(self.slots)), 0
        for digest in old:
            if digest:
                self.add(digest)
