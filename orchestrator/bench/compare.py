"""``handbook bench compare A.json B.json``: two ladders side by side, B against A (the reference's Table 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from ..core.errors import ConfigError
from .report import compare_table, stdout_console


def load_ladder(path: str) -> dict[str, Any]:
    """A ``ladder.json`` written by ``handbook bench``; anything else is a ConfigError."""
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None
    except orjson.JSONDecodeError:
        raise ConfigError(f"{p} is not JSON (expected a ladder.json written by 'handbook bench')") from None
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not all(
        isinstance(lv, dict) and isinstance(lv.get("streams"), int) and "sustained_tok_s" in lv for lv in levels
    ):
        raise ConfigError(f"{p} is not a ladder.json: it needs 'levels' with 'streams' and 'sustained_tok_s'")
    return data


def _label(data: dict[str, Any], path: str, other: str) -> str:
    if data.get("label"):
        return str(data["label"])
    p, q = Path(path), Path(other)
    if p.stem != q.stem:
        return p.stem
    return p.parent.name or p.stem


def compare(path_a: str, path_b: str, console: Console | None = None) -> int:
    """Print B against A (ratio B / A) at every stream count both ladders measured."""
    a, b = load_ladder(path_a), load_ladder(path_b)
    la, lb = _label(a, path_a, path_b), _label(b, path_b, path_a)
    if la == lb:
        la, lb = f"A ({la})", f"B ({lb})"
    if not {lv["streams"] for lv in a["levels"]} & {lv["streams"] for lv in b["levels"]}:
        raise ConfigError(f"{path_a} and {path_b} share no stream count; nothing to compare")
    console = console or stdout_console()
    console.print(compare_table(a, b, la, lb))
    for label, data in ((la, a), (lb, b)):
        fit = data.get("fit")
        if fit and fit.get("b_ms"):
            ceiling = f"{fit['ceiling_tok_s']:,.0f}" if fit.get("ceiling_tok_s") else "-"
            console.print(
                f"{label}: step = {fit['a_ms']:.2f} ms + {fit['b_ms']:.4f} ms x N, ceiling {ceiling} tok/s"
            )
    return 0
