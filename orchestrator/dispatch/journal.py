"""The resume journal: one SQLite file (WAL) in the out dir holding the job and every finished node.

    journal.sqlite
      meta   (key, value)        schema version, job key, prompt, public settings, model, outline once known
      nodes  (path, kind, ...)   every finished node — planning lists and sections — with its text, finish_reason,
                                 usage, backend, attempts and timings, committed the moment the node finishes; a
                                 planning node also keeps ``value``, the titles it was *accepted* with (its last
                                 reply alone may say otherwise: see below)
      committed (path, ...)      titles a planning node committed while its reply streamed (children were started
                                 from them) before the node itself finished
      runs   (id, ...)           one row per run of the job: when, how it ended, how many requests it made

A node is committed as soon as it finishes, so a kill -9 loses at most the requests in flight. Rerunning the
same command opens the same journal: the outline and finished sections are reused and only what is missing is
requested. The API key is never written (``Settings.public()`` leaves it out; backends are stored as URLs).

This module is the storage (its schema and migration: journal_schema.py; the out dir's lock and the journal's
files: journal_files.py). The Dispatcher, given the journal, is where resuming happens: a node already in the
journal is answered from it without a request, and a node that finishes is written to it (``Dispatcher.run``).

Why a planning node keeps its accepted titles and its committed ones: a node re-asked after an unusable reply
keeps the titles its earlier reply had already committed (their children were started), so its final list is
not what its last reply says. Re-parsing that reply on resume would make another outline, and the sections
written under the committed titles would land under other headings. So a stored node is used only under the
title it was written for (path *and* title match), a planning node is restored from ``value``, and a node that
never finished starts from its ``committed`` titles.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

import orjson

from ..core.errors import ConfigError, OutputError
from ..core.outline import Outline
from ..core.reply import Reply
from ..core.states import NodeKind, RunStatus
from .journal_files import lock_out_dir, no_room, remove_journal, storage_failure, unlock
from .journal_schema import dumps, open_db

FILENAME = "journal.sqlite"


def resume_key(prompt: str, settings: Any) -> dict[str, Any]:
    """What must be equal for a journal to be resumed: anything that would change the outline or the sections."""
    return {"prompt": prompt, **settings.resume_key()}


@dataclass(frozen=True)
class StoredNode:
    path: str
    kind: NodeKind
    title: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    backend: str | None
    attempts: int
    value: Any = None  # planning nodes: {"title", "items"} as accepted (None in a schema-1 journal)

    @property
    def context(self) -> Any:
        """A section's request context as journaled (``SectionRef.context``), None for older or planning nodes."""
        return self.value.get("context") if self.kind == NodeKind.SECTION and isinstance(self.value, dict) else None

    def reply(self) -> Reply:
        """The stored answer as a Reply (timed now: the original run's clock means nothing to this one)."""
        now = time.monotonic()
        return Reply(
            text=self.text, finish_reason=self.finish_reason, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, backend=self.backend or "", t_start=now, t_first=now,
            t_end=now, attempt=self.attempts,
        )


@dataclass(frozen=True)
class Committed:
    """Titles an unfinished planning node had committed (children were started from them)."""

    title: str | None
    items: tuple[str, ...]


# A section whose row an edited outline gives to another section is kept here, by what it was written for, so
# that no text is lost to an edit: undoing the edit, or a section moved after another took its path, finds it.
_DISPLACED_TABLE = """
CREATE TABLE IF NOT EXISTS displaced (
    kind TEXT NOT NULL, title TEXT NOT NULL, context TEXT NOT NULL, text TEXT NOT NULL, finish_reason TEXT,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, backend TEXT, attempts INTEGER NOT NULL,
    value TEXT, PRIMARY KEY (kind, title, context)
)"""
_DISPLACE = (
    "INSERT OR REPLACE INTO displaced SELECT kind, title, json_extract(value, '$.context'), text, finish_reason,"
    " prompt_tokens, completion_tokens, backend, attempts, value FROM nodes"
    " WHERE path = ? AND kind = 'section' AND json_extract(value, '$.context') IS NOT NULL"
)
_DISPLACED_PATH = "0.0.0"  # a section's level: where a displaced section stood matters no more

_NODE_COLUMNS = ("path, kind, title, text, finish_reason, prompt_tokens, completion_tokens, backend, attempts, "
                 "value")


class Journal:
    """The open journal of one out dir. Every write commits at once (WAL, synchronous=NORMAL).

    While it is open, the out dir is locked (``flock`` on ``journal.sqlite.lock``): a second job on the same
    ``--out`` is refused instead of interleaving its book with this one's."""

    def __init__(self, path: Path, conn: sqlite3.Connection, run_id: int, nodes: dict[str, StoredNode],
                 outline: Outline | None, committed: dict[str, tuple[str, Committed]], lock: Any = None,
                 displaced: tuple[StoredNode, ...] = ()):
        self.path = path
        self._db = conn
        self._lock = lock
        self.run_id = run_id
        self.nodes = nodes  # what earlier runs finished, by path
        # sections by what their request was made from (title and SectionRef.context), wherever they stood: a
        # section an edited outline.md moved is still the same section. A snapshot: this run's writes do not move it
        # (displaced: sections whose path an edit gave to another section; an undone edit finds them again)
        self._by_context = {
            (n.kind, n.title, dumps(n.context)): n for n in (*displaced, *nodes.values()) if n.context is not None
        }
        self.outline = outline  # the outline an earlier run stored, if it got that far
        self._committed = committed  # path -> (label, Committed) of planning nodes that had not finished
        self.written = 0  # nodes this run wrote
        self.written_sections = 0
        self._written_paths: set[str] = set()  # sections this run wrote, by path
        # A write that failed (a full disk): ``failure`` is the first, as the job's one-line error; ``failures``
        # counts them; ``on_failure`` (the Writer) is told of each, so that it stops asking for text it cannot keep.
        self._failed_why: str | None = None
        self.failures = 0
        self.on_failure: Callable[[OutputError], None] | None = None

    # -- opening ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, out_dir: Path, prompt: str, settings: Any, *, fresh: bool = False) -> Journal:
        """Open (or create) ``out_dir/journal.sqlite`` for this job, locking the out dir.

        Raises ConfigError when another job holds the out dir, when the file holds another job (another prompt),
        when the settings differ in a way that would change the outline or the sections (unless ``fresh``: then
        the old journal is discarded), or when it is not a journal we can read (corrupt, foreign, newer)."""
        path = out_dir / FILENAME
        lock = lock_out_dir(path)
        try:
            if fresh:
                remove_journal(path)
            journal = cls._open(path, prompt, settings, lock)
        except BaseException:
            unlock(lock)
            raise
        return journal

    @classmethod
    def _open(cls, path: Path, prompt: str, settings: Any, lock: Any) -> Journal:
        conn = None
        try:
            conn, meta = open_db(path, prompt, resume_key(prompt, settings), settings.public())
            nodes = {}
            for row in conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes"):
                path_, kind, title, text, finish, prompt_tokens, completion_tokens, backend, attempts, value = row
                nodes[path_] = StoredNode(path_, NodeKind(kind), title, text, finish, prompt_tokens, completion_tokens,
                                          backend, attempts, orjson.loads(value) if value else None)
            committed = {
                p: (label, Committed(title, tuple(orjson.loads(items))))
                for p, label, title, items in conn.execute("SELECT path, label, title, items FROM committed")
            }
            with conn:
                conn.execute(_DISPLACED_TABLE)  # added to schema 2 as it stands: an older file gains it here
            displaced = tuple(
                StoredNode(_DISPLACED_PATH, NodeKind(kind), title, text, finish, prompt_tokens, completion_tokens,
                           backend, attempts, orjson.loads(value) if value else None)
                for kind, title, text, finish, prompt_tokens, completion_tokens, backend, attempts, value
                in conn.execute(f"SELECT {_NODE_COLUMNS.removeprefix('path, ')} FROM displaced")
            )
            outline = Outline.from_json(orjson.loads(meta["outline"])) if "outline" in meta else None
            if outline is not None:
                _give_context(nodes, outline, settings.words)
            with conn:
                cur = conn.execute(
                    "INSERT INTO runs (started_at, status, resumed) VALUES (?, ?, ?)",
                    (time.time(), RunStatus.RUNNING, sum(1 for n in nodes.values() if n.kind == NodeKind.SECTION)),
                )
            run_id = cur.lastrowid
            assert run_id is not None  # an INSERT's row
        except ConfigError:
            if conn is not None:
                conn.close()
            raise
        except (sqlite3.Error, orjson.JSONDecodeError, KeyError, ValueError, TypeError, AttributeError) as e:
            if conn is not None:
                conn.close()
            why = " ".join(str(e).split())[:120] or type(e).__name__
            if isinstance(e, sqlite3.Error) and no_room(why):  # a good journal on a full disk: not bad input
                raise OutputError(f"cannot write {path}: {why}; free space and rerun to resume") from None
            raise ConfigError(
                f"{path} is not a readable handbook journal ({why}); remove it, choose another --out, "
                "or pass --fresh"
            ) from None
        return cls(path, conn, run_id, nodes, outline, committed, lock, displaced)

    # -- reading ------------------------------------------------------------------------------------------------

    def get(self, path: str, kind: NodeKind, title: str, context: Any = None) -> StoredNode | None:
        """The finished node written for this very node: at ``path`` with the same kind *and* title (a node
        re-planned under another title is another node; its old text must not land under the new heading). With a
        ``context`` (sections: what the request is made from besides the title), a node stored with another
        context does not answer, and one stored with this context answers from whatever path it was at."""
        n = self.nodes.get(path)
        if n is not None and n.kind == kind and n.title == title and (context is None or n.context in (None, context)):
            return n
        return self._by_context.get((kind, title, dumps(context))) if context is not None else None

    def committed(self, path: str, label: str) -> Committed | None:
        """Titles the unfinished planning node ``path`` (titled ``label``) committed in an earlier run."""
        got = self._committed.get(path)
        return got[1] if got is not None and got[0] == label else None

    @property
    def resumed(self) -> bool:
        return bool(self.nodes)

    # -- writing ------------------------------------------------------------------------------------------------

    def set_meta(self, key: str, value: Any) -> None:
        self._write("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    (key, value if isinstance(value, str) else dumps(value)))

    def check_model(self, model: str) -> None:
        """The model decides the outline too; it is known only once the backends were asked."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'model'").fetchone()
        if row is None:
            self.set_meta("model", model)
        elif row[0] != model:
            raise ConfigError(
                f"{self.path} was written with model {row[0]!r} but this run uses {model!r}; "
                "pass --fresh to start over, or --model to use the same one"
            )

    def store_outline(self, outline: Outline) -> None:
        self.set_meta("outline", outline.to_json())

    def commit_titles(self, path: str, label: str, title: str | None, items: list[str] | tuple[str, ...]) -> None:
        """Record the titles an unfinished planning node has committed so far (children started from them)."""
        self._write("INSERT OR REPLACE INTO committed (path, label, title, items) VALUES (?, ?, ?, ?)",
                    (path, label, title, dumps(list(items))))

    def record(self, path: str, kind: NodeKind, title: str, reply: Reply, attempts: int, value: Any = None) -> None:
        """Commit one finished node (``value``: a planning node's accepted titles, as JSON-able data)."""
        self._write_many([
            (_DISPLACE, (path,)),
            (
                "INSERT OR REPLACE INTO nodes (path, kind, title, text, finish_reason, prompt_tokens,"
                " completion_tokens, backend, attempts, latency_s, first_token_s, finished_at, run, value)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    path, kind, title, reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens,
                    reply.backend, attempts, round(reply.t_end - reply.t_start, 4),
                    None if reply.t_first is None else round(reply.t_first - reply.t_start, 4), time.time(),
                    self.run_id, None if value is None else dumps(value),
                ),
            ),
            ("DELETE FROM committed WHERE path = ?", (path,)),
        ])
        if not self._ok:
            return
        self.written += 1
        if kind == NodeKind.SECTION:
            self.written_sections += 1
            self._written_paths.add(path)

    @property
    def safe_sections(self) -> int:
        """Sections this journal holds (earlier runs' and this run's): what a rerun will not ask for again."""
        return len({p for p, n in self.nodes.items() if n.kind == NodeKind.SECTION} | self._written_paths)

    def lost_message(self, what: str, why: str) -> str:
        """The one line of a job that cannot write ``what``: which file, why, what is safe, what to do."""
        fix = "free space and rerun to resume" if no_room(why) else "fix that and rerun to resume"
        planned = (sum(1 for n in self.nodes.values() if n.kind != NodeKind.SECTION) + self.written
                   - self.written_sections)
        outline = f" and {planned} outline node(s)" if planned and self.outline is None else ""
        return (f"cannot write {what}: {why}; {self.safe_sections} finished section(s){outline} are safe in "
                f"{self.path}: {fix}")

    def move(self, node: StoredNode, path: str) -> None:
        """Record a stored node at its new ``path`` (an edited outline moved it), so the journal follows the outline
        the book was made from. Not a write of this run: ``written`` does not count it."""
        # from the snapshot, not the row: this run may already have written another node at the old path
        self._write_many([
            (_DISPLACE, (path,)),
            (
                "INSERT OR REPLACE INTO nodes (path, kind, title, text, finish_reason, prompt_tokens,"
                " completion_tokens, backend, attempts, finished_at, run, value) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (path, node.kind, node.title, node.text, node.finish_reason, node.prompt_tokens,
                 node.completion_tokens, node.backend, node.attempts, time.time(), self.run_id,
                 None if node.value is None else dumps(node.value)),
            ),
        ])

    def end_run(self, status: RunStatus, requests: int) -> None:
        self._write("UPDATE runs SET ended_at = ?, status = ?, requests = ? WHERE id = ?",
                    (time.time(), status, requests, self.run_id))

    def close(self) -> None:
        try:
            self._db.close()
        except sqlite3.Error:
            pass
        unlock(self._lock)
        self._lock = None

    _ok = True  # the last write went through

    def _write(self, sql: str, params: tuple) -> None:
        self._write_many([(sql, params)])

    def _write_many(self, statements: list[tuple[str, tuple]]) -> None:
        """Run statements in one transaction. A transaction that fails (a full disk) is rolled back whole and
        raises nothing: ``failure`` records it and ``on_failure`` hears of it (the job stops; see writing.py), and
        later writes are still tried, since each one that succeeds is a node kept. ``_ok`` says how the last
        one went."""
        try:
            with self._db:
                for sql, params in statements:
                    self._db.execute(sql, params)
        except (sqlite3.Error, OSError) as e:
            # The database failing to store (full, read-only, an I/O error, a damaged file) is this; a wrong
            # statement or parameter is a bug of ours and propagates.
            if not storage_failure(e):
                raise
            self._ok = False
            self.failures += 1
            if self._failed_why is None:
                self._failed_why = " ".join(str(e).split()) or type(e).__name__
            if self.on_failure is not None:
                self.on_failure(self.failure)  # type: ignore[arg-type]
            return
        self._ok = True

    @property
    def failure(self) -> OutputError | None:
        """The job's one-line error once a write failed (None before), counting what is safe as it is asked for:
        requests that were let finish after the first failure may have been kept."""
        if self._failed_why is None:
            return None
        return OutputError(self.lost_message(str(self.path), self._failed_why))


def section_times(out_dir: Path) -> dict[str, tuple[str, float, float]]:
    """Section path -> its title, and the Unix start and end of its accepted attempt, as ``out_dir``'s journal holds
    them (``finished_at`` and ``latency_s``): for a section answered from the journal, whose Reply is timed now. A
    section an edited outline moved keeps no latency and is left out; {} when there is no journal or it cannot be
    read. For a journal no job holds open (a finished book's): a plain connection, ``query_only``, so that closing
    it leaves no -wal and -shm files behind (a ``mode=ro`` one does)."""
    path = out_dir / FILENAME
    if not path.is_file():
        return {}
    try:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA query_only = ON")
            rows = conn.execute("SELECT path, title, finished_at, latency_s FROM nodes"
                                " WHERE kind = 'section' AND latency_s IS NOT NULL").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return {}
    return {p: (title, end - latency, end) for p, title, end, latency in rows}


def _give_context(nodes: dict[str, StoredNode], outline: Outline, words: int) -> None:
    """Sections journaled before their context was (an older handbook) get it from the outline they were written
    for, so that an edited outline.md cannot put their text under another chapter, part or length."""
    refs = {ref.path: ref for ref in outline.sections()}
    for path, node in nodes.items():
        ref = refs.get(path)
        if node.kind == NodeKind.SECTION and node.context is None and ref is not None and ref.title == node.title:
            value = node.value if isinstance(node.value, dict) else {}
            nodes[path] = replace(node, value={**value, "context": ref.context(ref.words or words)})
