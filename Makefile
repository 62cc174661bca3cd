# Every target bootstraps .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROMPT ?= Write me a complete software engineering handbook

.PHONY: install test demo bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

test: install
	$(PY) -m pytest -q

demo: install
	$(PY) scripts/demo.py "$(PROMPT)"

bench: install
	$(PY) benchmarks/typeset.py
	$(PY) benchmarks/client_overhead.py
	$(PY) benchmarks/published_take.py

lint: install
	$(VENV)/bin/ruff check orchestrator tests benchmarks

clean:
	rm -rf $(VENV) handbook-out test-artifacts .pytest_cache
