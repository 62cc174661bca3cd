"""The journal's files: the lock that keeps a second job off the out dir, removing an old journal (``--fresh``),
and telling a database that cannot store (a full disk) from a statement of ours that is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import ConfigError

# SQLite's primary result codes for a database that cannot store what it is given (extended codes such as
# SQLITE_IOERR_WRITE begin with these); anything else (SQLITE_ERROR: a wrong statement; SQLITE_MISUSE, SQLITE_RANGE,
# SQLITE_CONSTRAINT) is a fault of the code that asked.
_STORAGE_CODES = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_CORRUPT",
                  "SQLITE_NOTADB", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PERM", "SQLITE_NOMEM", "SQLITE_NOLFS")


def storage_failure(e: BaseException) -> bool:
    if isinstance(e, OSError):
        return True
    name = getattr(e, "sqlite_errorname", None) or ""
    return name.startswith(_STORAGE_CODES)


def no_room(why: str) -> bool:
    """Does an error's text say the disk (or the quota) is full? SQLite words it "database or disk is full"."""
    return any(w in why.lower() for w in ("disk is full", "no space left", "quota exceeded", "file too large"))


def lock_out_dir(path: Path) -> Any:
    """Hold an exclusive lock on the out dir for this job (released on close or when the process dies)."""
    import errno
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
    try:
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
    except OSError as e:  # the lock is held all the same; only the pid in it (for the message above) is missing
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            f.close()
            raise ConfigError(f"cannot write the lock file {lock_path}: {e.strerror or e}") from None
    return f


def unlock(lock: Any) -> None:
    if lock is not None:
        try:
            lock.close()  # closing the descriptor releases the flock
        except OSError:
            pass


def remove_journal(path: Path) -> None:
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise ConfigError(f"cannot remove the old journal {p}: {e.strerror or e}") from None
