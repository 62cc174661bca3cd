"""The vLLM-like simulator: one OpenAI-compatible HTTP server per simulated GPU card.

* :mod:`orchestrator.sim.engine` - the engine model (continuous batching, linear step cost, KV limit), with
  :mod:`~orchestrator.sim.prefix` (the prefix cache: prompts as tokens, chained block hashes, the block pool) and
  :mod:`~orchestrator.sim.hist` (its latency histograms);
* :mod:`orchestrator.sim.text` - deterministic answers (title lists, JSON, Markdown prose) and tokenisation,
  built by :mod:`~orchestrator.sim.titles` and :mod:`~orchestrator.sim.prose` from the word banks of
  :mod:`~orchestrator.sim.words` (``words.toml``) about the :mod:`~orchestrator.sim.context` of the prompt;
  :mod:`~orchestrator.sim.calibrate` measures a whole simulated book;
* :mod:`orchestrator.sim.server` - the aiohttp app of one card, with :mod:`~orchestrator.sim.chat` (the chat
  request's checks and errors), :mod:`~orchestrator.sim.faults` (fault injection) and
  :mod:`~orchestrator.sim.metrics` (``/metrics``);
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
