"""The journal's SQLite schema: its tables, its version, the migration of older files, and the checks an existing
file must pass before it is resumed (a handbook journal, of a version we read, of this very job)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson

from ..core.errors import ConfigError

SCHEMA_VERSION = 2  # 2: nodes.value, committed (1 is migrated on open)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    path              TEXT PRIMARY KEY,   -- '' for the book node, '3' part, '3.7' chapter, '3.7.12' section
    kind              TEXT NOT NULL,      -- book, part, chapter, section; brief (path 'brief': the book's brief)
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


def open_db(
    path: Path, prompt: str, key: dict[str, Any], public: dict[str, Any]
) -> tuple[sqlite3.Connection, dict[str, str]]:
    """Connect to ``path``, creating the journal of this job there if the file is new (or migrating an older one),
    and return the connection and the journal's meta. Raises ConfigError for a file of another job, another
    version or another program; sqlite3 and decoding errors for one that cannot be read (the connection is closed
    before any error leaves)."""
    conn = _connect(path)
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall()) if _has_meta(conn) else {}
        if meta:
            _check(path, meta, key)
            if meta.get("schema_version") == "1":
                _migrate_1(conn)
            return conn, meta
        if _has_tables(conn):
            raise ConfigError(f"{path} is an SQLite file of something else, not a handbook journal; "
                              "remove it, choose another --out, or pass --fresh")
        # One transaction for the tables and the meta that says whose they are: executescript commits what is
        # pending and runs its statements as they come, so the script opens the transaction itself (``with conn``
        # then commits it, or rolls it back); a process killed between the two left tables without meta, which
        # the next run refused as "an SQLite file of something else" (a kill -9 test in CI)
        with conn:
            conn.executescript("BEGIN IMMEDIATE;" + _SCHEMA)
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("app", "handbook"),
                    ("created_at", repr(time.time())),
                    ("prompt", prompt),
                    ("key", dumps(key)),
                    ("settings", dumps(public)),
                ],
            )
        return conn, dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except BaseException:
        conn.close()
        raise


def peek_job(path: Path) -> tuple[str, dict[str, Any], list[dict[str, Any]]] | None:
    """The prompt, settings (as ``Settings.public``) and backends (``[{"url", "cap"}]``; empty: the embedded engine)
    a journal was made with, read without locking or changing it; None when there is no journal at ``path``.
    ConfigError for a file that is not a readable handbook journal."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        finally:
            conn.close()
        if meta.get("app") != "handbook":
            raise ValueError("no handbook meta")
        settings = orjson.loads(meta["settings"])
        backends = orjson.loads(meta.get("backends", "[]"))
        if not isinstance(settings, dict) or not isinstance(backends, list):
            raise ValueError("its settings are not a mapping")
        return meta["prompt"], settings, backends
    except (sqlite3.Error, orjson.JSONDecodeError, KeyError, ValueError) as e:
        why = " ".join(str(e).split())[:120] or type(e).__name__
        raise ConfigError(f"{path} is not a readable handbook journal ({why})") from None


WAL_PAGES = 16


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.isolation_level = None
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    # The WAL is copied back into the file every WAL_PAGES pages (SQLite's default is 1,000: 4 MB), so the journal
    # takes little more room than what it keeps: a section costs a few pages of WAL per commit, and on a disk that
    # fills the WAL is what runs out first (a 256 KB --out kept no section at all with the default).
    conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={WAL_PAGES * 4096 * 2}")
    conn.isolation_level = "DEFERRED"  # ``with conn:`` begins (as plain BEGIN does) and commits
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


def dumps(v: Any) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
