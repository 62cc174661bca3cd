"""handbook: one prompt in, a book out, over a fleet of OpenAI-compatible servers.

The public API::

    from orchestrator import generate, agenerate, Backend, Settings
    result = generate("Write me a complete software engineering handbook",
                      backends=[Backend("http://gpu1:8000/v1", cap=256)],
                      settings=Settings(parts=8, chapters=12, sections=16), out="out/")
"""

from .config import PRESETS, Backend, Settings
from .errors import BackendError, ConfigError, HandbookError, Interrupted, PlanError
from .outline import Chapter, Outline, Part
from .run import Result, agenerate, generate

__all__ = [
    "PRESETS",
    "Backend",
    "BackendError",
    "Chapter",
    "ConfigError",
    "HandbookError",
    "Interrupted",
    "Outline",
    "Part",
    "PlanError",
    "Result",
    "Settings",
    "agenerate",
    "generate",
]
