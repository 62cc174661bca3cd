"""The vLLM-like simulator: one OpenAI-compatible HTTP server per simulated GPU card.

* :mod:`orchestrator.sim.engine` - the engine model (continuous batching, linear step cost, KV limit);
* :mod:`orchestrator.sim.text` - deterministic answers (title lists, JSON, Markdown prose) and tokenisation;
* :mod:`orchestrator.sim.server` - the aiohttp app of one card, with fault injection;
* :mod:`orchestrator.cli.sim` - ``handbook sim``;
* :mod:`orchestrator.sim.launch` - :class:`SimFleet`, for tests and benchmarks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimFleet"]


def __getattr__(name: str) -> Any:  # lazy, so that `handbook sim` imports only what it needs
    if name == "SimFleet":
        from .launch import SimFleet

        return SimFleet
    raise AttributeError(name)
