"""The embedded local engine: vLLM's CPU build serving SmolLM2-135M-Instruct, installed into its own cache.

* :mod:`.paths` - the cache dir and its layout; :mod:`.children` - environment, logs and stopping of the child
  processes; :mod:`.installer` - the engine venv and the model conversion (:mod:`.convert`, run by the
  engine's Python); :mod:`.server` - starting vLLM; :mod:`.process` - :class:`LocalEngine`, for one job;
  :mod:`.background` - the engine of `handbook engine start`.
"""

from .background import EngineState, engine_status, running_engine_url, start_background, stop_background
from .children import stop_process
from .installer import (
    INSTALL_HINT,
    MODEL_FORMAT,
    engine_python,
    install,
    model_ok,
    prepare_model,
    require_engine_python,
)
from .paths import MODEL_NAME, model_dir, resolve_cache_dir
from .process import LOCAL_DEFAULT_SHAPE, LocalEngine

__all__ = [
    "INSTALL_HINT",
    "LOCAL_DEFAULT_SHAPE",
    "MODEL_FORMAT",
    "MODEL_NAME",
    "EngineState",
    "LocalEngine",
    "engine_python",
    "engine_status",
    "install",
    "model_dir",
    "model_ok",
    "prepare_model",
    "require_engine_python",
    "resolve_cache_dir",
    "running_engine_url",
    "start_background",
    "stop_background",
    "stop_process",
]
