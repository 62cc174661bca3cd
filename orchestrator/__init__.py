"""handbook: one prompt in, a book out, over a fleet of OpenAI-compatible servers.

The public API::

    from orchestrator import generate, agenerate, generate_library, Backend, Settings
    result = generate("Write me a complete software engineering handbook",
                      backends=[Backend("http://gpu1:8000/v1", cap=256)],
                      settings=Settings(parts=8, chapters=12, sections=16), out="out/")

Importing the package is cheap: each name is imported on first use (PEP 562), so ``import orchestrator`` pulls in
neither WeasyPrint nor rich, and a typesetting worker or ``handbook sim`` loads only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ below imports on first use
    from .core.config import PRESETS, Backend, Settings
    from .core.errors import (
        BackendError,
        ConfigError,
        HandbookError,
        InternalError,
        Interrupted,
        OutputError,
        PlanError,
    )
    from .core.events import (
        BackendState,
        Delta,
        Event,
        ForecastReady,
        JobFinished,
        JobStarted,
        LevelPlanned,
        MetricsSample,
        NodeFailed,
        NodeFinished,
        NodeStarted,
        OutlineReady,
        ProbeStarted,
    )
    from .core.outline import Chapter, Outline, Part
    from .forecasting import Forecast, StepFit
    from .job.finish import Result
    from .job.library import LibraryResult, agenerate_library, generate_library
    from .job.run import agenerate, generate
    from .job.stepwise import aforecast, aplan, awrite, plan, write
    from .job.stepwise import forecast_of as forecast

# name -> the module that defines it (and, where the names differ, the name there)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["PRESETS", "Backend", "Settings"], ".core.config"),
    **dict.fromkeys(["BackendError", "ConfigError", "HandbookError", "InternalError", "Interrupted", "OutputError",
                     "PlanError"], ".core.errors"),
    **dict.fromkeys(
        [
            "BackendState", "Delta", "Event", "ForecastReady", "JobFinished", "JobStarted", "LevelPlanned",
            "MetricsSample", "NodeFailed", "NodeFinished", "NodeStarted", "OutlineReady", "ProbeStarted",
        ],
        ".core.events",
    ),
    **dict.fromkeys(["Chapter", "Outline", "Part"], ".core.outline"),
    "Result": ".job.finish",
    **dict.fromkeys(["Forecast", "StepFit"], ".forecasting"),
    **dict.fromkeys(["agenerate", "generate"], ".job.run"),
    **dict.fromkeys(["LibraryResult", "agenerate_library", "generate_library"], ".job.library"),
    **dict.fromkeys(["aforecast", "aplan", "awrite", "plan", "write"], ".job.stepwise"),
    "forecast": ".job.stepwise:forecast_of",  # the module orchestrator.forecasting is the model; this is the call
}

__all__ = [
    "PRESETS",
    "Backend",
    "BackendError",
    "BackendState",
    "Chapter",
    "ConfigError",
    "Delta",
    "Event",
    "Forecast",
    "ForecastReady",
    "HandbookError",
    "InternalError",
    "Interrupted",
    "JobFinished",
    "JobStarted",
    "LevelPlanned",
    "LibraryResult",
    "MetricsSample",
    "NodeFailed",
    "NodeFinished",
    "NodeStarted",
    "Outline",
    "OutlineReady",
    "OutputError",
    "Part",
    "PlanError",
    "ProbeStarted",
    "Result",
    "Settings",
    "StepFit",
    "aforecast",
    "agenerate",
    "agenerate_library",
    "aplan",
    "awrite",
    "forecast",
    "generate",
    "generate_library",
    "plan",
    "write",
]


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module, __name__), attr or name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
