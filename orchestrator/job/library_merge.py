"""`handbook library merge DIR... --out DIR`: the shards of one library joined (their datasets row group by row group,
their stats merged, their books linked)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..core.errors import ConfigError
from .library_dataset import DatasetWriter, _ids_and_keys
from .library_input import DigestSet, id_digest

__all__ = ["merge", "merge_stats"]

_MERGE_FILES = ("sections.parquet", "books.parquet", "stats.json")


# stats.json keys a merge sums (counts over the shards' books), and the one it takes the largest of (the shards
# ran side by side: the library took as long as its slowest shard)
ADDITIVE = ("books", "books_done", "books_written", "carried_over", "section_tokens", "requests_this_run",
            "tokens_written_this_run", "failed_books", "sections", "tokens_written", "requests", "planning_requests",
            "request_errors", "unusable_replies", "stopped_answers", "signed_off_answers", "planning_stopped",
            "resumed_sections", "words", "failed_sections", "empty_sections", "truncated_sections",
            "loop_cut_sections")
LARGEST = ("whole_job_s",)


def merge_stats(shards: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The stats.json of a merged library from its shards' (folder, stats): the counts summed, ``whole_job_s`` the
    largest, and ``shards`` listing each one's folder, books and time. A key no shard has is left out."""
    def numbers(key: str) -> list[float]:
        return [s[key] for _, s in shards if isinstance(s.get(key), int | float) and not isinstance(s[key], bool)]

    out: dict[str, Any] = {k: sum(v) for k in ADDITIVE if (v := numbers(k))}
    out.update({k: max(v) for k in LARGEST if (v := numbers(k))})
    out["failed_book_ids"] = [i for _, st in shards for i in (st.get("failed_book_ids") or ())]
    out["shards"] = [{"dir": d, "books": s.get("books"), "whole_job_s": s.get("whole_job_s")} for d, s in shards]
    return out


def merge(dirs: Sequence[str | Path], out: str | Path, formats: Sequence[str] | None = None) -> dict[str, Any]:
    """``handbook library merge DIR... --out OUT``: the shards' datasets concatenated row group by row group, their
    stats merged (:func:`merge_stats`) into OUT/stats.json, their books/<id>/ hard-linked into OUT/books/ (copied
    across file systems). ``formats`` None: jsonl too when every shard has it. A book in two shards, a missing input,
    OUT among the inputs: one-line ConfigErrors. Returns the merged stats."""
    sources, target = [Path(d) for d in dirs], Path(out)
    stats = _check_merge(sources, target)
    _check_ids(sources)
    if formats is None:
        formats = ("parquet", "jsonl") if all((d / "sections.jsonl").is_file() for d in sources) else ("parquet",)
    with DatasetWriter(target, formats) as w:
        for d in sources:
            try:
                w.copy_from(d)
            except (pa.ArrowException, KeyError) as e:  # a damaged file, or one of another schema
                raise ConfigError(f"library merge: cannot read the dataset of {d}: {' '.join(str(e).split())}") \
                    from None
    for d in sources:
        for book_id in _ids(d):
            _link_tree(d / "books" / book_id, target / "books" / book_id)
    merged = merge_stats([(str(d), s) for d, s in zip(sources, stats)])
    part = target / "stats.json.part"
    part.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    os.replace(part, target / "stats.json")
    return merged


def _check_merge(sources: list[Path], target: Path) -> list[dict[str, Any]]:
    """Each shard's stats.json, once every input is known to be there and OUT is none of them."""
    if not sources:
        raise ConfigError("library merge: no shard folders given (handbook library merge DIR... --out DIR)")
    if len({d.resolve() for d in sources}) < len(sources):
        raise ConfigError("library merge: a shard folder is given twice")
    if target.resolve() in {d.resolve() for d in sources}:
        raise ConfigError(f"library merge: --out {target} is one of the shards; merge into a new folder")
    stats = []
    for d in sources:
        missing = [f for f in _MERGE_FILES if not (d / f).is_file()]
        if missing:
            raise ConfigError(f"library merge: {d} has no {' or '.join(missing)} (not a finished library shard)")
        try:
            data = json.loads((d / "stats.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"library merge: cannot read {d / 'stats.json'}: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"library merge: {d / 'stats.json'} is not a JSON object")
        stats.append(data)
    return stats


def _check_ids(sources: list[Path]) -> None:
    """No book id in two shards (case folded: one folder on some file systems). Streams the id columns, holding a
    64-bit digest a book (library_input.DigestSet); a digest met twice is confirmed by reading the ids again."""
    seen = DigestSet()
    for k, d in enumerate(sources):
        for n, book_id in enumerate(_ids(d)):
            folded = book_id.lower()
            if seen.add(id_digest(folded)):
                continue
            earlier = ((j, m, other) for j, src in enumerate(sources[:k + 1]) for m, other in enumerate(_ids(src)))
            owner = next((sources[j] for j, m, other in earlier if (j, m) < (k, n) and other.lower() == folded), None)
            if owner is not None:
                where = "twice in it" if owner == d else f"also in {owner}"
                raise ConfigError(f"library merge: book {book_id!r} of {d} is {where}: each book belongs to one shard")


def _ids(d: Path) -> Iterator[str]:
    try:
        for book_id, _, _ in _ids_and_keys(d / "books.parquet"):
            yield book_id
    except (OSError, pa.ArrowException, KeyError) as e:
        raise ConfigError(f"library merge: cannot read {d / 'books.parquet'}: {' '.join(str(e).split())}") from None


def _link_tree(src: Path, dst: Path) -> None:
    """``src``'s files under ``dst``: hard links (no second copy; deleting the shard later leaves the merged library
    whole, unlike symlinks), else copies. A missing ``src`` (a book without files) is skipped."""
    if not src.is_dir():
        return
    for root, _, names in os.walk(src):
        here = dst / Path(root).relative_to(src)
        here.mkdir(parents=True, exist_ok=True)
        for name in names:
            target = here / name
            target.unlink(missing_ok=True)
            try:
                os.link(Path(root) / name, target)
            except OSError:
                shutil.copy2(Path(root) / name, target)

