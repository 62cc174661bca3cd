"""The embedded local engine: vLLM's CPU build serving SmolLM2-135M-Instruct, installed into its own cache."""

from .process import LocalEngine

__all__ = ["LocalEngine"]
