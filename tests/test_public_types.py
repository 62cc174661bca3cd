"""What type checkers see of the public API is the public API: ``orchestrator/__init__.py`` is lazy (PEP 562), so
its names reach mypy, pyright and IDEs only through its ``if TYPE_CHECKING:`` imports, and a name missing there is
``Any`` to them while it works at run time. The block, ``__all__`` and the lazy-import table (``_EXPORTS``) must
therefore name the same things, each taken from the same module under the same name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import orchestrator

INIT = Path(orchestrator.__file__)


def type_checking_imports() -> list[tuple[str, str, str]]:
    """(public name, module as written, name in that module) for every import under ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text(), filename=str(INIT))
    blocks = [
        node for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, "orchestrator/__init__.py should have one top-level `if TYPE_CHECKING:` block"
    found: list[tuple[str, str, str]] = []
    for node in ast.walk(blocks[0]):
        if isinstance(node, ast.Import):
            raise AssertionError(f"line {node.lineno}: use `from .module import name` in the TYPE_CHECKING block")
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                assert alias.name != "*", f"line {node.lineno}: a star import hides which names are public"
                found.append((alias.asname or alias.name, module, alias.name))
    return found


def lazy_table() -> dict[str, tuple[str, str]]:
    """``_EXPORTS`` as (module, name in that module)."""
    table: dict[str, tuple[str, str]] = {}
    for name, where in orchestrator._EXPORTS.items():
        module, _, attr = where.partition(":")
        table[name] = (module, attr or name)
    return table


def test_the_type_checking_block_names_every_public_name_once() -> None:
    names = [name for name, _, _ in type_checking_imports()]
    assert len(names) == len(set(names)), f"imported twice: {sorted({n for n in names if names.count(n) > 1})}"
    public = set(orchestrator.__all__)
    assert sorted(public - set(names)) == [], "in __all__ but not in the TYPE_CHECKING block (Any to type checkers)"
    assert sorted(set(names) - public) == [], "in the TYPE_CHECKING block but not in __all__"


def test_the_lazy_table_is_the_public_api() -> None:
    assert sorted(lazy_table()) == sorted(orchestrator.__all__)


def test_each_name_comes_from_the_same_module_for_type_checkers_and_at_run_time() -> None:
    table = lazy_table()
    for name, module, attr in type_checking_imports():
        assert table.get(name) == (module, attr), (
            f"{name}: the TYPE_CHECKING block imports {attr} from {module}, the lazy table says {table.get(name)}"
        )


def test_every_type_checking_import_resolves_to_the_runtime_object() -> None:
    for name, module, attr in type_checking_imports():
        defining = importlib.import_module(module, orchestrator.__name__)
        assert hasattr(defining, attr), f"{defining.__name__} has no {attr} (the TYPE_CHECKING import of {name})"
        assert getattr(orchestrator, name) is getattr(defining, attr), name
