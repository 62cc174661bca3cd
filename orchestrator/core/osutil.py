"""What the job, the bench, the simulator and the engine each need from the operating system, in one place:
a free port, a higher open-file limit (and caps that fit the one there is), a writable output folder, and files
written whole or not at all."""

from __future__ import annotations

import errno
import logging
import math
import os
import resource
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import ConfigError, OutputError

__all__ = ["FD_RESERVE", "atomic_path", "atomic_write", "ensure_open_files", "free_port", "no_room", "port_free",
           "prepare_out_dir", "raise_open_file_limit"]

log = logging.getLogger("handbook")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def raise_open_file_limit(needed: int) -> int:
    """Raise the soft open-file limit towards ``needed`` (never past the hard limit); returns the soft limit now in
    force (``needed`` when unlimited). Never raises: callers decide what too low means."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def prepare_out_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and its parents) and prove it writable, or raise a one-line error: :class:`OutputError`
    when the disk is full (free space and rerun), else :class:`ConfigError` (a folder that cannot be ours)."""
    out = Path(path)
    probe = out / ".handbook-write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        try:
            probe.unlink(missing_ok=True)
        except OSError:  # no folder to hold it (a file stands where the folder should)
            pass
        if no_room(e):
            raise OutputError(f"cannot write to output directory {out}: {e.strerror or e}; free space and "
                              "rerun") from None
        raise ConfigError(f"cannot write to output directory {out}: {e.strerror or e}") from None
    return out


def no_room(e: BaseException) -> bool:
    """Is ``e`` a full disk or an exhausted quota (not a permission or a path that is wrong)?"""
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path`` to write the file at; when the block ends without an error it is synced and
    renamed onto ``path`` (one rename: a reader, a kill or a full disk sees the old file or the new one, never half
    of one), and on any error it is removed, leaving ``path`` as it stood. The suffix is kept last, so that a
    writer that picks its format by the name (matplotlib) still does."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        _sync(tmp)  # the data is on disk before the name points at it
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        # a failed write() names no file, a failed open or rename the temporary copy: name the file being written
        if e.filename is None or str(e.filename) == str(tmp):
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` whole or not at all (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


# Files besides the streams: the journal, /metrics scrapes, the feed, and the typesetting workers' pipes (three
# each; typesetting while writing runs at most typeset.background.MAX_WORKERS of them beside the streams)
FD_RESERVE = 128


def ensure_open_files(caps: list[int]) -> list[int]:
    """Raise the open-file soft limit to what the fan-out needs; if the hard limit is lower, shrink the caps
    (and say so) rather than let sockets fail."""
    needed = sum(caps) + FD_RESERVE
    soft = raise_open_file_limit(needed)
    if soft >= needed:
        return caps
    room = max(len(caps), soft - FD_RESERVE)
    scale = room / sum(caps)
    new = [max(1, math.floor(c * scale)) for c in caps]
    log.warning(
        "the open-file limit is %d (it cannot be raised further) but %d concurrent streams need %d; "
        "lowering the per-backend caps to %s so no socket fails",
        soft, sum(caps), needed, new,
    )
    return new
