"""What the job, the bench, the simulator and the engine each need from the operating system, in one place:
a free port, a higher open-file limit, a writable output folder."""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

from .errors import ConfigError

__all__ = ["free_port", "port_free", "prepare_out_dir", "raise_open_file_limit"]


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
