"""The architecture shows in the tree: orchestrator/ holds the stage packages only, beside the public API's two
files, and no package shadows a public function."""

from __future__ import annotations

import ast
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


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
TESTS = Path(__file__).resolve().parent
TOP_LEVEL_TESTS = {"test_exported_members.py", "test_public_types.py", "test_layout.py"}  # orchestrator/__init__.py


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_80_lines():
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = n
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_tests_mirror_the_packages():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name not in {"__pycache__", "artifacts"}}
    assert folders <= STAGES, f"test folders that are not packages: {sorted(folders - STAGES)}"
    at_top = {p.name for p in TESTS.glob("test_*.py")}
    assert at_top == TOP_LEVEL_TESTS, f"tests beside the package folders: {sorted(at_top - TOP_LEVEL_TESTS)}"
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), "two test files share a name (pytest imports them by basename)"
    assert (TESTS / "conftest.py").is_file()


def test_no_test_file_over_400_lines():
    long = {str(p.relative_to(TESTS)): n for p in TESTS.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"test files over {MAX_MODULE_LINES} lines: {long}"
