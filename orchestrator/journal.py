"""The resume journal: one SQLite file (WAL) in the out dir holding the job and every finished node.

    journal.sqlite
      meta   (key, value)        schema version, job key, prompt, public settings, model, outline once known
      nodes  (path, kind, ...)   every finished node — planning lists and sections — with its text, finish_reason,
                                 usage, backend, attempts and timings, committed the moment the node finishes
      runs   (id, ...)           one row per run of the job: when, how it ended, how many requests it made

A node is committed as soon as it finishes, so a kill -9 loses at most the requests in flight. Rerunning the
same command opens the same journal: the outline and finished sections are reused and only what is missing is
requested. The API key is never written (``Settings.public()`` leaves it out; backends are stored as URLs).

``Resuming`` wraps the Dispatcher: a node already in the journal is answered from it without a request; a node
that finishes is written to it. The planner and the runner use it exactly like the Dispatcher.
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

SCHEMA_VERSION = 1
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
    run               INTEGER NOT NULL
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

    def reply(self) -> Reply:
        """The stored answer as a Reply (timed now: the original run's clock means nothing to this one)."""
        now = time.monotonic()
        return Reply(
            text=self.text, finish_reason=self.finish_reason, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, backend=self.backend or "", t_start=now, t_first=now,
            t_end=now, attempt=self.attempts,
        )


class Journal:
    """The open journal of one out dir. Every write commits at once (WAL, synchronous=NORMAL)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, run_id: int, nodes: dict[str, StoredNode],
                 outline: Outline | None):
        self.path = path
        self._db = conn
        self.run_id = run_id
        self.nodes = nodes  # what earlier runs finished, by path
        self.outline = outline  # the outline an earlier run stored, if it got that far
        self.written = 0  # nodes this run wrote
        self.written_sections = 0
        self._broken = False

    # -- opening ------------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, out_dir: Path, prompt: str, settings: Any, *, fresh: bool = False) -> Journal:
        """Open (or create) ``out_dir/journal.sqlite`` for this job.

        Raises ConfigError when the file holds another job (another prompt), when the settings differ in a way
        that would change the outline or the sections (unless ``fresh``: then the old journal is discarded), or
        when it is not a journal we can read."""
        path = out_dir / FILENAME
        if fresh:
            _remove(path)
        key = resume_key(prompt, settings)
        try:
            conn = _connect(path)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if _has_meta(conn) else {}
        except sqlite3.DatabaseError as e:
            raise ConfigError(
                f"{path} is not a handbook journal ({e}); remove it, choose another --out, or pass --fresh"
            ) from None
        if meta:
            try:
                _check(path, meta, key)
            except ConfigError:
                conn.close()
                raise
        else:
            try:
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
            except sqlite3.Error as e:
                conn.close()
                raise ConfigError(f"cannot write the journal {path}: {e}") from None
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        nodes = {
            row[0]: StoredNode(*row)
            for row in conn.execute(
                "SELECT path, kind, title, text, finish_reason, prompt_tokens, completion_tokens, backend, attempts "
                "FROM nodes"
            )
        }
        outline = Outline.from_json(orjson.loads(meta["outline"])) if "outline" in meta else None
        with conn:
            cur = conn.execute(
                "INSERT INTO runs (started_at, status, resumed) VALUES (?, 'running', ?)",
                (time.time(), sum(1 for n in nodes.values() if n.kind == "section")),
            )
        return cls(path, conn, int(cur.lastrowid), nodes, outline)

    # -- reading ------------------------------------------------------------------------------------------------

    def get(self, path: str, kind: str) -> StoredNode | None:
        n = self.nodes.get(path)
        return n if n is not None and n.kind == kind else None

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

    def record(self, path: str, kind: str, title: str, reply: Reply, attempts: int) -> None:
        """Commit one finished node."""
        self._write(
            "INSERT OR REPLACE INTO nodes (path, kind, title, text, finish_reason, prompt_tokens, completion_tokens,"
            " backend, attempts, latency_s, first_token_s, finished_at, run) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                path, kind, title, reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens,
                reply.backend, attempts, round(reply.t_end - reply.t_start, 4),
                None if reply.t_first is None else round(reply.t_first - reply.t_start, 4), time.time(), self.run_id,
            ),
        )
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

    def _write(self, sql: str, params: tuple) -> None:
        if self._broken:
            return
        try:
            with self._db:
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


def _has_meta(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is not None


def _check(path: Path, meta: dict[str, str], key: dict[str, Any]) -> None:
    if meta.get("app") != "handbook":
        raise ConfigError(f"{path} is not a handbook journal; remove it, choose another --out, or pass --fresh")
    version = int(meta.get("schema_version", "0"))
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"{path} has journal schema {version}, this handbook reads {SCHEMA_VERSION}; pass --fresh to start over"
        )
    old = orjson.loads(meta["key"])
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

    ``resumed`` counts the nodes answered from the journal, by kind; ``fresh_nodes`` the nodes requested, by
    planning level (0 book, 1 part, 2 chapter, 3 section)."""

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
        **kwargs: Any,
    ):
        from .dispatch import Outcome

        stored = self.journal.get(path, kind) if self.journal is not None else None
        if stored is not None:
            reply = stored.reply()
            try:
                value = validate(reply) if validate is not None else None
            except ValueError:
                stored = None  # the journal holds something we cannot use any more: ask again
            else:
                self.resumed[kind] = self.resumed.get(kind, 0) + 1
                self.resumed_levels[_level(path)] += 1
                return Outcome(reply, value, 0)
        out = await self.d.run(path, kind, title, build, validate, priority, **kwargs)
        if out.reply.ok and self.journal is not None:
            self.journal.record(path, kind, title, out.reply, out.attempts)
        return out


def _level(path: str) -> int:
    return len(path.split(".")) if path else 0
