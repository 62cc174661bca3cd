"""The background engine of `handbook engine start`: one server that outlives the command, recorded in
``engine/state.json`` so that later jobs reuse it and `handbook engine stop` finds it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..core.errors import BackendError, ConfigError
from ..core.osutil import free_port, port_free
from .children import Progress, pid_alive, say, stop_process
from .installer import prepare_model, require_engine_python
from .paths import MODEL_NAME, locked, resolve_cache_dir, run_dir, state_file
from .server import SERVER_MODULE, Startup, health, spawn

__all__ = ["EngineState", "engine_status", "running_engine_url", "start_background", "stop_background"]


@dataclass(frozen=True)
class EngineState:
    pid: int
    port: int
    url: str
    model: str
    started_at: float
    log: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_state(cache: Path) -> EngineState | None:
    try:
        data = json.loads(state_file(cache).read_text())
        return EngineState(**{f.name: data[f.name] for f in fields(EngineState)})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_our_server(state: EngineState) -> bool:
    """The pid is alive and is a vLLM server on the recorded port (not a reused pid)."""
    if not pid_alive(state.pid):
        return False
    try:
        argv = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return SERVER_MODULE.encode() in argv and str(state.port).encode() in argv


def engine_status(cache_dir: str | os.PathLike[str] | None = None) -> tuple[EngineState | None, bool]:
    """(state, healthy) of the background engine; a stale state file (dead pid) is removed."""
    cache = resolve_cache_dir(cache_dir)
    state = _read_state(cache)
    if state is None:
        return None, False
    if not _is_our_server(state):
        with contextlib.suppress(OSError):
            state_file(cache).unlink()
        return None, False
    return state, health(state.url.removesuffix("/v1"), timeout=2.0)


def running_engine_url(cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The base URL (ending /v1) of a healthy background engine started by `handbook engine start`, else None."""
    state, healthy = engine_status(cache_dir)
    return state.url if state is not None and healthy else None


def start_background(
    cache_dir: str | os.PathLike[str] | None = None,
    port: int | None = None,
    on_progress: Progress | None = None,
    start_timeout: float = 600.0,
) -> EngineState:
    """Start an engine that outlives this process (or return the running one) and record it in state.json."""
    cache = resolve_cache_dir(cache_dir)
    with locked(cache / "engine" / "start.lock"):
        state, healthy = engine_status(cache)
        if state is not None:
            if port is not None and port != state.port:
                raise ConfigError(f"the local engine already runs on port {state.port}; stop it first")
            if not healthy:  # still starting (another `engine start`), or wedged
                deadline = time.monotonic() + start_timeout
                while not health(state.url.removesuffix("/v1")):
                    if not _is_our_server(state) or time.monotonic() > deadline:
                        raise BackendError(f"the recorded local engine (pid {state.pid}) is not healthy; "
                                           "run `handbook engine stop` and start again")
                    time.sleep(0.5)
            return state
        model = prepare_model(cache, on_progress=on_progress)
        py = require_engine_python(cache)
        if port is not None and not port_free(port):
            raise ConfigError(f"port {port} on 127.0.0.1 is already in use")
        port = port if port is not None else free_port()
        proc, log = spawn(cache, py, model, port, tie_to_parent=False)
        base = f"http://127.0.0.1:{port}"
        state = EngineState(proc.pid, port, f"{base}/v1", MODEL_NAME, time.time(), str(log))
        state_file(cache).write_text(json.dumps(state.as_dict(), indent=2) + "\n")
        st = Startup(proc, log, base, start_timeout, on_progress)
        try:
            st.wait()
        except BaseException:
            stop_process(proc.pid)
            with contextlib.suppress(OSError):
                state_file(cache).unlink()
            raise
        say(on_progress, f"local engine ready at {state.url} after {time.monotonic() - st.t0:.0f} s")
        return state


def stop_background(cache_dir: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> EngineState | None:
    """Stop the background engine; returns what was stopped, or None when none was running."""
    cache = resolve_cache_dir(cache_dir)
    state = _read_state(cache)
    stopped: EngineState | None = None
    if state is not None and _is_our_server(state):
        stop_process(state.pid, timeout)
        stopped = state
    with contextlib.suppress(OSError):
        state_file(cache).unlink()
    if state is not None:
        shutil.rmtree(run_dir(cache, state.port), ignore_errors=True)
    return stopped
