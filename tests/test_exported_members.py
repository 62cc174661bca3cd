"""The public API is what `__all__` says, and nothing slips in or out unnoticed (as httpx's
test_exported_members.py does): the top level and each sub-package's `__init__` pin their names here. A change to
the API is a change to this file, made on purpose."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

EXPORTED = {
    "orchestrator": [
        "PRESETS", "Backend", "BackendError", "BackendState", "Chapter", "ConfigError", "Delta", "Event", "Forecast",
        "ForecastReady", "HandbookError", "InternalError", "Interrupted", "JobFinished", "JobStarted", "LevelPlanned", "LibraryResult", "MetricsSample",
        "NodeFailed", "NodeFinished", "NodeStarted", "Outline", "OutlineReady", "OutputError", "Part", "PlanError", "ProbeStarted",
        "Result",
        "Settings", "StepFit", "aforecast", "agenerate", "agenerate_library", "aplan", "awrite", "forecast", "generate", "generate_library",
        "plan", "write",
    ],
    "orchestrator.typeset": ["TypesetInfo", "typeset", "typeset_to"],
    "orchestrator.bench": [
        "DEFAULT_STREAMS", "BenchSettings", "chart_svg", "compare", "fit_line", "fit_step", "ladder_table",
        "load_ladder", "run_ladder", "stdout_console", "write_outputs",
    ],
    "orchestrator.engine": [
        "INSTALL_HINT", "LOCAL_DEFAULT_SHAPE", "MODEL_FORMAT", "MODEL_NAME", "EngineState", "LocalEngine",
        "engine_python", "engine_status", "install", "model_dir", "model_ok", "prepare_model", "require_engine_python",
        "resolve_cache_dir", "running_engine_url", "start_background", "stop_background", "stop_process",
    ],
    "orchestrator.planning": [
        "Planner", "SectionCallback", "TitleStream", "Titles", "book_title_from_prompt", "extract_titles",
        "parse_titles", "weak_title",
    ],
    "orchestrator.metrics": [
        "FAMILIES", "GENERATION_METRIC", "PROMPT_METRIC", "RUNNING_METRIC", "WAITING_METRIC", "Counters",
        "MetricsSampler", "Point", "ServerFamily", "counter_increase", "metrics_url", "parse_metrics",
        "server_counted", "unavailable",
    ],
    "orchestrator.forecasting": [
        "Forecast", "StepFit", "fit_budget", "fits_from_ladder", "forecast", "probe_fits",
    ],
    "orchestrator.cli": ["main"],
    "orchestrator.sim": ["SimFleet"],
}


@pytest.mark.parametrize("package", sorted(EXPORTED))
def test_all_is_pinned_and_every_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(EXPORTED[package])
    assert len(set(module.__all__)) == len(module.__all__), "a name is listed twice"
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{package}.{name} does not resolve"


def test_the_top_level_names_are_the_ones_their_modules_define() -> None:
    import orchestrator
    from orchestrator.core import events
    from orchestrator.job import run

    assert orchestrator.generate is run.generate
    assert callable(orchestrator.plan) and callable(orchestrator.write) and callable(orchestrator.forecast)
    assert orchestrator.Event == events.Event
    with pytest.raises(AttributeError):
        _ = orchestrator.no_such_name  # type: ignore[attr-defined]


def test_importing_the_package_imports_nothing_heavy() -> None:
    # PEP 562: `import orchestrator` stays cheap; the names load on first use. A fresh interpreter, so nothing
    # another test imported counts.
    code = (
        "import sys, orchestrator\n"
        "heavy = [m for m in ('weasyprint', 'rich', 'aiohttp', 'anyio', 'openai', 'pypdf', 'orchestrator.job.run')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "from orchestrator import Settings\n"
        "print('weasyprint' in sys.modules, 'rich' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "", f"import orchestrator pulled in {out[0]}"
    assert out[1] == "False False", "importing Settings pulled in WeasyPrint or rich"
