"""What the job, the bench, the simulator and the engine each need from the operating system, in one place:
a free port, a higher open-file limit (and caps that fit the one there is), a writable output folder."""

from __future__ import annotations

import logging
import math
import os
import resource
import socket
from pathlib import Path

from .errors import ConfigError

__all__ = ["FD_RESERVE", "ensure_open_files", "free_port", "port_free", "prepare_out_dir", "raise_open_file_limit"]

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
    """Create ``path`` (and its parents) and prove it writable, or raise a one-line :class:`ConfigError`."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".handbook-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"cannot write to output directory {out}: {e.strerror or e}") from None
    return out


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
