"""LocalEngine: the embedded engine for the length of one job (vLLM's CPU build serving SmolLM2-135M-Instruct on
127.0.0.1), used when a job is given no backend."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import MappingProxyType
from typing import Self

from ..core.errors import ConfigError
from ..core.osutil import free_port, port_free
from .background import running_engine_url
from .children import Progress, killpg, say, stop_process
from .installer import prepare_model, require_engine_python
from .paths import MODEL_NAME, resolve_cache_dir, run_dir
from .server import Startup, health, spawn

__all__ = ["LOCAL_DEFAULT_SHAPE", "LocalEngine"]

# A job on the local engine that was given no shape gets this one, so that it ends in minutes on a CPU.
LOCAL_DEFAULT_SHAPE = MappingProxyType({"parts": 3, "chapters": 3, "sections": 4})


class LocalEngine:
    """vLLM serving SmolLM2-135M-Instruct on a free 127.0.0.1 port, for the length of a ``with`` block.

    ``with LocalEngine() as eng:`` or ``async with LocalEngine() as eng:``; then ``eng.url`` (base URL ending
    in /v1) and ``eng.model``. On enter: prepare the model, start the server, wait for /health (progress goes to
    ``on_progress``). On exit, on errors and on Ctrl-C: SIGTERM, then SIGKILL after ``stop_timeout`` seconds;
    the server also gets SIGTERM if this process dies. With ``reuse`` (the default) a background engine from
    ``handbook engine start`` is used instead when one is running, and left running on exit.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        port: int | None = None,
        on_progress: Progress | None = None,
        *,
        reuse: bool = True,
        start_timeout: float = 600.0,
        stop_timeout: float = 30.0,
    ):
        self.cache_dir = resolve_cache_dir(cache_dir)
        self.port = port
        self.on_progress = on_progress
        self.reuse = reuse
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.url: str | None = None
        self.model = MODEL_NAME
        self.reused = False
        self.start_s: float | None = None
        self.stop_s: float | None = None
        self.log: Path | None = None
        self._proc: subprocess.Popen | None = None

    # -- shared steps
    def _try_reuse(self) -> bool:
        if not self.reuse or self.port is not None:
            return False
        url = running_engine_url(self.cache_dir)
        if url is None:
            return False
        self.url, self.reused = url, True
        say(self.on_progress, f"using the running local engine at {url}")
        return True

    def _launch(self, model: Path) -> Startup:
        py = require_engine_python(self.cache_dir)
        port = self.port if self.port is not None else free_port()
        if self.port is not None and not port_free(port):
            raise ConfigError(f"port {port} on 127.0.0.1 is already in use")
        self._proc, self.log = spawn(self.cache_dir, py, model, port, tie_to_parent=True)
        self.port = port
        base = f"http://127.0.0.1:{port}"
        return Startup(self._proc, self.log, base, self.start_timeout, self.on_progress)

    def _ready(self, st: Startup) -> None:
        self.start_s = time.monotonic() - st.t0
        self.url = f"{st.base}/v1"
        say(self.on_progress, f"local engine ready at {self.url} after {self.start_s:.0f} s")

    def stop(self) -> None:
        """Stop the server this object started (a no-op for a reused or stopped one)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self.stop_s = stop_process(proc.pid, self.stop_timeout)
        else:
            killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self.port is not None:
            shutil.rmtree(run_dir(self.cache_dir, self.port), ignore_errors=True)

    # -- sync
    def __enter__(self) -> Self:
        if self._try_reuse():
            return self
        model = prepare_model(self.cache_dir, on_progress=self.on_progress)
        try:
            st = self._launch(model)
            st.wait()
            self._ready(st)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- async (anyio)
    async def __aenter__(self) -> Self:
        import anyio
        import anyio.to_thread

        if await anyio.to_thread.run_sync(self._try_reuse):
            return self
        model = await anyio.to_thread.run_sync(
            lambda: prepare_model(self.cache_dir, on_progress=self.on_progress), abandon_on_cancel=True
        )
        try:
            st = self._launch(model)  # Popen in this thread: the parent-death signal follows this thread
            while not await anyio.to_thread.run_sync(health, st.base, 1.0, abandon_on_cancel=True):
                st.check()
                await anyio.sleep(0.5)
            self._ready(st)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.stop)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        import anyio
        import anyio.to_thread

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)
