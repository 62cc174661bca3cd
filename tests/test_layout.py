"""The architecture shows in the tree: orchestrator/ holds the stage packages only, beside the public API's two
files, and no package shadows a public function."""

from __future__ import annotations

from pathlib import Path

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent
STAGES = {"core", "wire", "dispatch", "book", "job", "views", "planning", "typeset", "forecasting", "metrics", "bench",
          "sim", "engine", "cli"}


def test_orchestrator_holds_the_stage_packages_and_the_public_api_only():
    entries = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and p.name != "templates"}
    files = {n for n in entries if (PACKAGE / n).is_file()}
    folders = entries - files
    assert files == {"__init__.py", "__main__.py"}, f"modules beside the packages: {sorted(files)}"
    assert folders == STAGES, f"packages: {sorted(folders)}"
    for stage in folders:
        assert (PACKAGE / stage / "__init__.py").is_file(), f"{stage} is not a package"
    for name in ("plan", "write", "forecast"):  # the public functions: no package may shadow them
        assert name not in folders and callable(getattr(orchestrator, name))
