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

``Resuming`` wraps the Dispatcher: a node already in the journal is answered from it without a request; a node
that finishes is written to it. The planner and the runner use it exactly like the Dispatcher.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from .client import BackendClient, Reply
from .errors import ConfigError
from .outline import Outline

T = TypeVar("T")

SCHEMA_VERSION = 2  # 2: nodes.value, committed (1 is migrated on open)
FILENAME = "journal.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    path              TEXT PRIMARY KEY,   -- '' for the book node, '3' part, '3.7' chapter, '3.7.12' section
    kind              TEXT NOT NULL,      -- book, part, chapter, section
    title             TEXT NOT NULL,
    text              TEXT NOT NULL,
    finish_reason     TEXT,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    backend           TEXT,
    attempts          INTEGER NOT NULL,
    latency_s         REAL,               -- request start -> last byte of the accepted attempt
    first_token_s     REAL,               -- request start -> first token
    finished_at       REAL NOT NULL,      -- wall clock (time.time())
    run               INTEGER NOT NULL,
    value             TEXT                -- planning nodes: the accepted titles as JSON {"title", "items"}
);
CREATE TABLE IF NOT EXISTS committed (
    path   TEXT PRIMARY KEY,              -- a planning node that had not finished
    label  TEXT NOT NULL,                 -- its own title (the node is only this node under this title)
    title  TEXT,                          -- the book title it committed (book node only)
    items  TEXT NOT NULL                  -- JSON list of the titles committed so far, in order
);
CREATE TABLE IF NOT EXISTS runs (
    id         INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    ended_at   REAL,
    status     TEXT NOT NULL,             -- running, complete, incomplete, interrupted, aborted
    requests   INTEGER,
    resumed    INTEGER
);
"""


def resume_key(prompt: str, settings: Any) -> dict[str, Any]:
    """What must be equal for a journal to be resumed: anything that would change the outline or the sections."""
    return {"prompt": prompt, **settings.resume_key()}


@dataclass(frozen=True)
class StoredNode:
    path: str
    kind: str
    title: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    backend: str | None
    attempts: int
    value: Any = None  # planning nodes: {"title", "items"} as accepted (None in a schema-1 journal)

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


_NODE_COLUMNS = ("path, kind, title, text, finish_reason, prompt_tokens, completion_tokens, backend, attempts, "
                 "value")


class Journal:
    """The open journal of one out dir. Every write commits at once (WAL, synchronous=NORMAL).

    While it is open, the out dir is locked (``flock`` on ``journal.sqlite.lock``): a second job on the same
    ``--out`` is refused instead of interleaving its book with this one's."""

    def __init__(self, path: Path, conn: sqlite3.Connection, run_id: int, nodes: dict[str, StoredNode],
                 outline: Outline | None, committed: dict[str, tuple[str, Committed]], lock: Any = None):
        self.path = path
        self._db = conn
        self._lock = lock
        self.run_id = run_id
        self.nodes = nodes  # what earlier runs finished, by path
        self.outline = outline  # the outline an earlier run stored, if it got that far
        self._committed = committed  # path -> (label, Committed) of planning nodes that had not finished
        self.written = 0  # nodes this run wrote
        self.written_sections = 0
        self._broken = False

    # -- opening ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, out_dir: Path, prompt: str, settings: Any, *, fresh: bool = False) -> Journal:
        """Open (or create) ``out_dir/journal.sqlite`` for this job, locking the out dir.

        Raises ConfigError when another job holds the out dir, when the file holds another job (another prompt),
        when the settings differ in a way that would change the outline or the sections (unless ``fresh``: then
        the old journal is discarded), or when it is not a journal we can read (corrupt, foreign, newer)."""
        path = out_dir / FILENAME
        lock = _lock(path)
        try:
            if fresh:
                _remove(path)
            journal = cls._open(path, prompt, settings, lock)
        except BaseException:
            _unlock(lock)
            raise
        return journal

    @classmethod
    def _open(cls, path: Path, prompt: str, settings: Any, lock: Any) -> Journal:
        key = resume_key(prompt, settings)
        conn = None
        try:
            conn = _connect(path)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if _has_meta(conn) else {}
            if meta:
                _check(path, meta, key)
                if meta.get("schema_version") == "1":
                    _migrate_1(conn)
            else:
                if _has_tables(conn):
                    raise ConfigError(f"{path} is an SQLite file of something else, not a handbook journal; "
                                      "remove it, choose another --out, or pass --fresh")
                with conn:
                    conn.executescript(_SCHEMA)
                    conn.executemany(
                        "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                        [
                            ("schema_version", str(SCHEMA_VERSION)),
                            ("app", "handbook"),
                            ("created_at", repr(time.time())),
                            ("prompt", prompt),
                            ("key", _dumps(key)),
                            ("settings", _dumps(settings.public())),
                        ],
                    )
                meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            nodes = {}
            for row in conn.execute(f"SELECT {_NODE_COLUMNS} FROM nodes"):
                value = orjson.loads(row[9]) if row[9] else None
                nodes[row[0]] = StoredNode(*row[:9], value=value)
            committed = {
                p: (label, Committed(title, tuple(orjson.loads(items))))
                for p, label, title, items in conn.execute("SELECT path, label, title, items FROM committed")
            }
            outline = Outline.from_json(orjson.loads(meta["outline"])) if "outline" in meta else None
            with conn:
                cur = conn.execute(
                    "INSERT INTO runs (started_at, status, resumed) VALUES (?, 'running', ?)",
                    (time.time(), sum(1 for n in nodes.values() if n.kind == "section")),
                )
        except ConfigError:
            if conn is not None:
                conn.close()
            raise
        except (sqlite3.Error, orjson.JSONDecodeError, KeyError, ValueError, TypeError, AttributeError) as e:
            if conn is not None:
                conn.close()
            why = " ".join(str(e).split())[:120] or type(e).__name__
            raise ConfigError(
                f"{path} is not a readable handbook journal ({why}); remove it, choose another --out, "
                "or pass --fresh"
            ) from None
        return cls(path, conn, int(cur.lastrowid), nodes, outline, committed, lock)

    # -- reading ------------------------------------------------------------------------------------------------

    def get(self, path: str, kind: str, title: str) -> StoredNode | None:
        """The finished node at ``path`` if it was written for this very node: same kind *and* same title. A node
        re-planned under another title is another node; its old text must not land under the new heading."""
        n = self.nodes.get(path)
        return n if n is not None and n.kind == kind and n.title == title else None

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
                    (key, value if isinstance(value, str) else _dumps(value)))

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
                    (path, label, title, _dumps(list(items))))

    def record(self, path: str, kind: str, title: str, reply: Reply, attempts: int, value: Any = None) -> None:
        """Commit one finished node (``value``: a planning node's accepted titles, as JSON-able data)."""
        self._write_many([
            (
                "INSERT OR REPLACE INTO nodes (path, kind, title, text, finish_reason, prompt_tokens,"
                " completion_tokens, backend, attempts, latency_s, first_token_s, finished_at, run, value)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    path, kind, title, reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens,
                    reply.backend, attempts, round(reply.t_end - reply.t_start, 4),
                    None if reply.t_first is None else round(reply.t_first - reply.t_start, 4), time.time(),
                    self.run_id, None if value is None else _dumps(value),
                ),
            ),
            ("DELETE FROM committed WHERE path = ?", (path,)),
        ])
        self.written += 1
        if kind == "section":
            self.written_sections += 1

    def end_run(self, status: str, requests: int) -> None:
        self._write("UPDATE runs SET ended_at = ?, status = ?, requests = ? WHERE id = ?",
                    (time.time(), status, requests, self.run_id))

    def close(self) -> None:
        try:
            self._db.close()
        except sqlite3.Error:
            pass
        _unlock(self._lock)
        self._lock = None

    def _write(self, sql: str, params: tuple) -> None:
        self._write_many([(sql, params)])

    def _write_many(self, statements: list[tuple[str, tuple]]) -> None:
        """Run statements in one transaction."""
        if self._broken:
            return
        try:
            with self._db:
                for sql, params in statements:
                    self._db.execute(sql, params)
        except sqlite3.Error as e:  # a full disk must not lose the book being made; it loses the resume point
            import logging

            logging.getLogger("handbook").warning(
                "the journal %s cannot be written (%s): this run goes on, but cannot be resumed", self.path, e
            )
            self._broken = True


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.isolation_level = None
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.isolation_level = ""  # ``with conn:`` commits
    return conn


def _has_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table'").fetchone() is not None


def _migrate_1(conn: sqlite3.Connection) -> None:
    """Schema 1 -> 2: planning nodes gain ``value`` (absent for old nodes: they are re-parsed from their reply),
    and the ``committed`` table is added."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(nodes)")}
    with conn:
        if "value" not in columns:  # a migration cut short before its version was written: do only the rest
            conn.execute("ALTER TABLE nodes ADD COLUMN value TEXT")
        conn.executescript(_SCHEMA)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))


def _lock(path: Path) -> Any:
    """Hold an exclusive lock on the out dir for this job (released on close or when the process dies)."""
    import fcntl
    import os

    lock_path = path.with_name(path.name + ".lock")
    try:
        f = open(lock_path, "a+")
    except OSError as e:
        raise ConfigError(f"cannot create the lock file {lock_path}: {e.strerror or e}") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise ConfigError(
            f"another handbook job{who} is writing to {path.parent}; wait for it, or choose another --out"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def _unlock(lock: Any) -> None:
    if lock is not None:
        try:
            lock.close()  # closing the descriptor releases the flock
        except OSError:
            pass


def _has_meta(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is not None


def _check(path: Path, meta: dict[str, str], key: dict[str, Any]) -> None:
    if meta.get("app") != "handbook":
        raise ConfigError(f"{path} is not a handbook journal; remove it, choose another --out, or pass --fresh")
    try:
        version = int(meta.get("schema_version", "0"))
    except ValueError:
        version = -1
    if version not in (1, SCHEMA_VERSION):
        raise ConfigError(
            f"{path} has journal schema {version}, this handbook reads {SCHEMA_VERSION}; pass --fresh to start over"
        )
    old = orjson.loads(meta["key"])
    if not isinstance(old, dict):
        raise ValueError("its job key is not a mapping")
    if old.get("prompt") != key["prompt"]:
        raise ConfigError(
            f"{path.parent} holds another job's journal (prompt {_clip(old.get('prompt'))}); "
            "choose another --out, or pass --fresh to overwrite it"
        )
    changed = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in key.items() if old.get(k) != v]
    if changed:
        raise ConfigError(
            f"{path} was written with other settings ({'; '.join(changed)}) that would change the book; "
            "rerun with the same settings to resume, or pass --fresh to start over"
        )


def _clip(s: Any, n: int = 60) -> str:
    s = str(s)
    return repr(s if len(s) <= n else s[: n - 1] + "…")


def _dumps(v: Any) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _remove(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise ConfigError(f"cannot remove the old journal {p}: {e.strerror or e}") from None


class Resuming:
    """A Dispatcher that answers from the journal what an earlier run finished and journals what this run does.

    A stored node answers only the node it was written for: same path, kind *and* title (``Journal.get``).
    ``restore(stored)`` turns a stored node into the caller's value (planning nodes: the accepted titles), or
    returns None to ask again; without it the stored reply goes through ``validate`` like a fresh one. ``keep``
    gives the JSON-able value to journal with a finished node. ``resumed`` counts the nodes answered from the
    journal, by kind; ``resumed_levels`` by planning level (0 book, 1 part, 2 chapter, 3 section)."""

    def __init__(self, dispatcher: Any, journal: Journal | None):
        self.d = dispatcher
        self.journal = journal
        self.resumed: dict[str, int] = {}
        self.resumed_levels = [0, 0, 0, 0]

    def __getattr__(self, name: str) -> Any:  # requests, replies, request_errors, fleet...
        return getattr(self.d, name)

    async def run(
        self,
        path: str,
        kind: str,
        title: str,
        build: Callable[[BackendClient, int], dict[str, Any]],
        validate: Callable[[Reply], T] | None = None,
        priority: tuple[int, int] = (1, 0),
        *,
        restore: Callable[[StoredNode], T | None] | None = None,
        keep: Callable[[T], Any] | None = None,
        **kwargs: Any,
    ):
        from .dispatch import Outcome

        stored = self.journal.get(path, kind, title) if self.journal is not None else None
        if stored is not None:
            value: Any = None
            try:
                if restore is not None:
                    value = restore(stored)
                    if value is None:
                        raise ValueError("nothing to restore")
                elif validate is not None:
                    value = validate(stored.reply())
            except ValueError:
                stored = None  # the journal holds something we cannot use any more: ask again
            else:
                self.resumed[kind] = self.resumed.get(kind, 0) + 1
                self.resumed_levels[_level(path)] += 1
                return Outcome(stored.reply(), value, 0)
        out = await self.d.run(path, kind, title, build, validate, priority, **kwargs)
        if out.reply.ok and self.journal is not None:
            kept = keep(out.value) if keep is not None and out.value is not None else None
            self.journal.record(path, kind, title, out.reply, out.attempts, kept)
        return out


def _level(path: str) -> int:
    return len(path.split(".")) if path else 0
