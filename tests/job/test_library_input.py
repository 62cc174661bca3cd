"""A library's FILE: every bad line is one ConfigError line FILE:LINE, the file is read lazily, ids and keys are
stable, and shards split the books without a coordinator."""

from __future__ import annotations

import hashlib
import json
import re
import tracemalloc
from pathlib import Path

import orjson
import pytest

from orchestrator.core.config import SETTING_NAMES, Settings
from orchestrator.core.errors import ConfigError
from orchestrator.job.library_input import (
    BOOK_KEYS,
    PER_BOOK_SETTINGS,
    LibraryBook,
    _settings_blob,
    book_key,
    check_file,
    derive_id,
    iter_books,
    parse_shard,
    shard_of,
)

BASE = Settings()
GOOD = '{"prompt": "A first book", "parts": 2}'


def write(tmp_path: Path, *lines: str, name: str = "lib.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p


def one_error(path: Path, line: int) -> str:
    """check_file's error: exactly one line, starting FILE:LINE: (iter_books finds the same line)."""
    with pytest.raises(ConfigError) as info:
        check_file(path, BASE)
    message = str(info.value)
    assert "\n" not in message and message == info.value.message
    assert message.startswith(f"{path}:{line}: "), message
    with pytest.raises(ConfigError) as again:
        list(iter_books(path, BASE))
    assert str(again.value) == message
    return message[len(f"{path}:{line}: "):]


BAD_LINES = {
    "not json": ('{"prompt": "x",', r"^not JSON"),
    "not an object": ('["a list"]', r"expected a JSON object"),
    "a string": ('"just text"', r"expected a JSON object"),
    "no prompt": ('{"parts": 2}', r'no "prompt"'),
    "empty prompt": ('{"prompt": "   "}', r"empty prompt"),
    "prompt not text": ('{"prompt": 7}', r"'prompt': expected text"),
    "unknown key": ('{"prompt": "x", "chapter": 3}', r"unknown key 'chapter' \(did you mean 'chapters'\?\)"),
    "misspelt prompt": ('{"promt": "x"}', r"did you mean 'prompt'"),
    "unrelated key": ('{"prompt": "x", "zzzzzz": 1}', r"unknown key 'zzzzzz' \(a line may set "),
    "run-wide setting": ('{"prompt": "x", "cap": 8}', r"'cap' is a setting of the whole run"),
    "run-wide job key": ('{"prompt": "x", "backend": "http://h/v1"}', r"'backend' is a setting of the whole run"),
    "wrong type": ('{"prompt": "x", "parts": "2"}', r"setting 'parts': expected a whole number"),
    "bool for an int": ('{"prompt": "x", "parts": true}', r"setting 'parts': expected a whole number"),
    "list for a number": ('{"prompt": "x", "temperature": [1]}', r"setting 'temperature': expected"),
    "out of range": ('{"prompt": "x", "parts": 0}', r"parts must be a whole number of at least 1"),
    "temperature range": ('{"prompt": "x", "temperature": 9}', r"temperature must be between"),
    "bad profile": ('{"prompt": "x", "profile": "nope"}', r"profile must be one of"),
    "id not text": ('{"prompt": "x", "id": 12}', r"'id': expected text"),
    "id with slash": ('{"prompt": "x", "id": "a/b"}', r"cannot name a folder"),
    "id dot dot": ('{"prompt": "x", "id": ".."}', r"cannot name a folder"),
    "id inner dot dot": ('{"prompt": "x", "id": "a..b"}', r"cannot name a folder"),
    "id hidden": ('{"prompt": "x", "id": ".git"}', r"cannot name a folder"),
    "id empty": ('{"prompt": "x", "id": ""}', r"cannot name a folder"),
    "id control char": ('{"prompt": "x", "id": "a\\u0001b"}', r"cannot name a folder"),
    "id newline": ('{"prompt": "x", "id": "a\\nb"}', r"cannot name a folder"),
    "id backslash": ('{"prompt": "x", "id": "a\\\\b"}', r"cannot name a folder"),
    "id too long": ('{"prompt": "x", "id": "' + "a" * 101 + '"}', r"cannot name a folder"),
    "duplicate id": ('{"prompt": "y", "id": "a-first-book-' + hashlib.sha256(b"A first book").hexdigest()[:8]
                     + '"}', r"duplicate id .* \(first on line 3\)$"),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_every_bad_line_is_one_error_line_naming_its_line(tmp_path, kind):
    line, pattern = BAD_LINES[kind]
    path = write(tmp_path, "", "  ", GOOD, '{"prompt": "another book", "id": "other"}', "", line, GOOD + " ")
    assert re.search(pattern, one_error(path, 6)), kind


def test_the_same_prompt_twice_without_ids_says_to_give_one_an_id(tmp_path):
    path = write(tmp_path, GOOD, '{"prompt": "B"}', '{"prompt": "  A first book ", "words": 100}')
    assert re.search(r"duplicate id 'a-first-book-[0-9a-f]{8}' \(first on line 1\): the same prompt twice; "
                     'give one of the lines an "id"', one_error(path, 3))


def test_ids_that_differ_in_case_only_are_one_folder(tmp_path):
    path = write(tmp_path, '{"prompt": "a", "id": "Intro"}', '{"prompt": "b", "id": "intro"}')
    assert "same folder as 'Intro' of line 1" in one_error(path, 2)


def test_a_plain_text_duplicate_prompt(tmp_path):
    path = write(tmp_path, "Write about owls", "Write about cats", "Write about owls", name="lib.txt")
    assert "first on line 1" in one_error(path, 3)


def test_a_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "lib.jsonl"
    path.write_bytes(GOOD.encode() + b'\n{"prompt": "caf\xe9"}\n')
    assert "not UTF-8" in one_error(path, 2)


@pytest.mark.parametrize("content", ["", "\n\n   \n\t\n"])
def test_a_file_without_books_is_an_error(tmp_path, content):
    path = tmp_path / "lib.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"no books") as info:
        check_file(path, BASE)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"cannot read library file .*nope\.jsonl"):
        check_file(tmp_path / "nope.jsonl", BASE)


def test_a_good_file_is_read_with_its_settings(tmp_path):
    path = write(tmp_path, "\ufeff", '{"prompt": " Rust ", "parts": 2, "temperature": null}', "",
                 '{"prompt": "Go", "id": "go-book", "chapters": 3, "temperature": 0.5, "system": "Be brief."}')
    summary = check_file(path, BASE)
    assert (summary.format, summary.books, summary.in_shard, summary.shard) == ("jsonl", 2, 2, None)
    first, second = list(iter_books(path, BASE))
    assert isinstance(first, LibraryBook)
    assert (first.line, first.prompt, first.overrides, first.id) == (2, "Rust", {"parts": 2}, derive_id("Rust"))
    assert first.settings == Settings(parts=2)
    assert (second.line, second.id, second.settings.chapters, second.settings.temperature) == (4, "go-book", 3, 0.5)
    assert second.settings.parts == BASE.parts and second.settings.system == "Be brief."


def test_plain_text_is_one_prompt_a_line(tmp_path):
    path = write(tmp_path, "Write about owls", "", '  {"looks": "like json"} later is a prompt  ', name="lib.txt")
    assert check_file(path, Settings(parts=3)).format == "text"
    books = list(iter_books(path, Settings(parts=3)))
    assert [(b.line, b.prompt) for b in books] == [(1, "Write about owls"), (3, '{"looks": "like json"} later is a prompt')]
    assert all(b.overrides == {} and b.settings == Settings(parts=3) for b in books)


def test_a_jsonl_file_rejects_a_plain_line(tmp_path):
    path = write(tmp_path, GOOD, "Write about owls")
    assert one_error(path, 2).startswith("not JSON")


def test_the_per_book_keys_are_settings_that_shape_one_book():
    assert PER_BOOK_SETTINGS <= SETTING_NAMES
    assert BOOK_KEYS == PER_BOOK_SETTINGS | {"prompt", "id"}
    for run_wide in ("cap", "api_key", "model", "formats", "templates", "connect_timeout_s", "attempts", "pages"):
        assert run_wide not in BOOK_KEYS
    for per_book in ("parts", "chapters", "sections", "words", "max_tokens", "profile", "temperature"):
        assert per_book in BOOK_KEYS


def test_derived_ids_are_folder_safe_and_depend_on_the_prompt_only():
    for prompt in ("Write me a complete software engineering handbook", "../../etc/passwd", "日本語の本", "x" * 500,
                   "a/b\\c:d*e?f\x00g"):
        book_id = derive_id(prompt)
        assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}-[0-9a-f]{8}", book_id), book_id
        assert book_id == derive_id(prompt)
    assert derive_id("Rust") == "rust-" + hashlib.sha256(b"Rust").hexdigest()[:8]
    assert derive_id("Rust") != derive_id("rust")


def test_ids_stay_when_lines_are_appended_or_reordered(tmp_path):
    lines = [json.dumps({"prompt": f"Book number {i}", **({"id": f"b{i}"} if i % 2 else {})}) for i in range(6)]
    before = {b.prompt: b.id for b in iter_books(write(tmp_path, *lines[:4]), BASE)}
    after = {b.prompt: b.id for b in iter_books(write(tmp_path, *reversed(lines)), BASE)}
    assert {p: after[p] for p in before} == before
    assert len(set(after.values())) == 6


def test_a_changed_prompt_or_setting_changes_that_books_key_only(tmp_path):
    lines = ['{"prompt": "One", "id": "one"}', '{"prompt": "Two", "id": "two", "parts": 2}',
             '{"prompt": "Three", "id": "three"}']
    keys = {b.id: b.key for b in iter_books(write(tmp_path, *lines), BASE)}
    assert len(set(keys.values())) == 3
    edits = {"one": '{"prompt": "One, revised", "id": "one"}', "two": '{"prompt": "Two", "id": "two", "parts": 3}',
             "three": '{"prompt": "Three", "id": "three", "words": 300}'}
    for book_id, edited in edits.items():
        changed = [edited if f'"id": "{book_id}"' in line else line for line in lines]
        new = {b.id: b.key for b in iter_books(write(tmp_path, *changed), BASE)}
        assert [i for i in keys if new[i] != keys[i]] == [book_id]


def test_the_key_is_the_prompt_and_what_decides_the_text():
    assert book_key("A", BASE) == book_key("A", Settings())
    assert book_key("A", Settings(temperature=0)) == book_key("A", Settings(temperature=0.0))
    assert book_key("A", Settings(temperature=0)) != book_key("A", BASE)  # None: the profile's, not 0
    for changed in (Settings(words=300), Settings(max_tokens=600), Settings(sections=3), Settings(system="Brief."),
                    Settings(profile="reasoning") if "reasoning" in _profiles() else Settings(top_p=0.5)):
        assert book_key("A", changed) != book_key("A", BASE)
    for unchanged in (Settings(cap=8), Settings(attempts=2), Settings(connect_timeout_s=3.0), Settings(affinity=False)):
        assert book_key("A", unchanged) == book_key("A", BASE)
    # what each section request carries and what is asked again decide the text too (a line changing them redoes
    # its book); made the reference's way, a book keeps the key it had before these settings existed
    for changed in (Settings(context="none"), Settings(distinct_titles=False), Settings(repairs=False),
                    Settings(finish_truncated=True)):
        assert book_key("A", changed) != book_key("A", BASE)
    reference = Settings(context="none", distinct_titles=False, repairs=False)
    assert _settings_blob(reference) == orjson.dumps(reference.resume_key(), option=orjson.OPT_SORT_KEYS)
    assert re.fullmatch(r"[0-9a-f]{32}", book_key("A", BASE))


def _profiles() -> tuple[str, ...]:
    from orchestrator.core.profiles import PROFILE_NAMES

    return tuple(PROFILE_NAMES)


def test_the_command_lines_settings_change_every_key(tmp_path):
    path = write(tmp_path, '{"prompt": "One"}', '{"prompt": "Two", "words": 100}')
    plain = [b.key for b in iter_books(path, BASE)]
    longer = [b.key for b in iter_books(path, Settings(words=400))]
    assert plain[0] != longer[0]
    assert plain[1] == longer[1]  # the line's own words win over the run's


def test_shard_of_is_a_stable_sha256_of_the_id():
    assert shard_of("rust-intro", 1) == 0
    digest = hashlib.sha256(b"rust-intro").digest()
    assert shard_of("rust-intro", 7) == int.from_bytes(digest[:8], "big") % 7
    assert shard_of("Rust-Intro", 7) == shard_of("rust-intro", 7)
    with pytest.raises(ValueError):
        shard_of("x", 0)


def test_shards_are_disjoint_cover_every_id_and_are_balanced():
    ids = [derive_id(f"Book {i}") for i in range(8000)]
    n = 4
    shards = [{i for i in ids if shard_of(i, n) == k} for k in range(n)]
    assert set().union(*shards) == set(ids)
    assert sum(len(s) for s in shards) == len(ids)
    assert all(abs(len(s) - len(ids) / n) < 0.1 * len(ids) / n for s in shards), [len(s) for s in shards]


def test_iter_books_over_shards_partitions_the_file(tmp_path):
    path = write(tmp_path, *(json.dumps({"prompt": f"Book {i}"}) for i in range(300)))
    every = [b.id for b in iter_books(path, BASE)]
    parts = [[b.id for b in iter_books(path, BASE, (k, 3))] for k in range(3)]
    assert sorted(i for p in parts for i in p) == sorted(every) and all(parts)
    counts = [check_file(path, BASE, (k, 3)) for k in range(3)]
    assert [c.in_shard for c in counts] == [len(p) for p in parts] and {c.books for c in counts} == {300}


@pytest.mark.parametrize(("spec", "want"), [("0/4", (0, 4)), (" 3 / 4 ", (3, 4)), ("0/1", (0, 1))])
def test_parse_shard(spec, want):
    assert parse_shard(spec) == want


@pytest.mark.parametrize("spec", ["4/4", "1/0", "0/0", "a/b", "-1/4", "1", "", "1/2/3", "1.0/2"])
def test_parse_shard_rejects_bad_specs_in_one_line(spec):
    with pytest.raises(ConfigError, match=r"--shard") as info:
        parse_shard(spec)
    assert "\n" not in str(info.value)


def _big_file(tmp_path: Path, lines: int) -> Path:
    path = tmp_path / "big.txt"
    filler = "and how its pieces fit together"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(lines):
            fh.write(f"Write a handbook about topic {i} {filler}\n")
    return path


def test_a_large_library_streams_through_iter_books(tmp_path):
    """200,000 lines (~12 MB) through a generator: what it holds does not grow with the lines read (a shard holds
    its own ids only). Traced over the last 50,000 lines, tracemalloc costing ~7x the time of the lines it sees."""
    path = _big_file(tmp_path, 200_000)
    books = iter_books(path, BASE, (0, 16))
    count = 0
    for book in books:
        count += 1
        if book.line >= 150_000:
            break
    tracemalloc.start()
    try:
        count += sum(1 for _ in books)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 200_000 / 16 * 0.8 < count < 200_000 / 16 * 1.2
    line_bytes = path.stat().st_size / 200_000
    # holding the last 50,000 lines would take 50,000 x their length, and more as str objects
    assert peak < 50_000 * line_bytes / 4, (peak, line_bytes)


def test_check_file_holds_a_few_dozen_bytes_a_line(tmp_path):
    """The duplicate check's digests are what check_file keeps: 8-byte slots, 11 to 32 bytes a line."""
    path = _big_file(tmp_path, 40_000)
    tracemalloc.start()
    try:
        summary = check_file(path, BASE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary.books == 40_000
    assert peak / 40_000 < 64, f"{peak / 40_000:.0f} bytes a line"


def test_a_digest_collision_is_confirmed_by_rereading_the_file(tmp_path, monkeypatch):
    from orchestrator.job import library_input

    monkeypatch.setattr(library_input, "id_digest", lambda folded: 7)  # every id collides with every other
    path = write(tmp_path, *(json.dumps({"prompt": f"Book {i}"}) for i in range(50)))
    assert check_file(path, BASE).books == 50
    path = write(tmp_path, '{"prompt": "a", "id": "x"}', '{"prompt": "b"}', '{"prompt": "c", "id": "X"}')
    assert "same folder as 'x' of line 1" in one_error(path, 3)


def test_the_digest_set_grows_and_tells_new_from_seen():
    from orchestrator.job.library_input import DigestSet

    digests = DigestSet()
    values = [int.from_bytes(hashlib.sha256(str(i).encode()).digest()[:8], "big") or 1 for i in range(20_000)]
    assert all(digests.add(v) for v in values)
    assert not any(digests.add(v) for v in values[::7])
    assert digests.count == 20_000 and len(digests.slots) >= 20_000 * 4 // 3


def test_the_example_library_is_five_small_books():
    path = Path(__file__).resolve().parents[2] / "examples" / "library.jsonl"
    assert check_file(path, BASE).books == 5
    books = list(iter_books(path, BASE))
    assert len({b.prompt for b in books}) == 5 and any(b.overrides.keys() - {"parts", "chapters", "sections"}
                                                       for b in books)
    assert all(b.settings.parts * b.settings.chapters * b.settings.sections <= 12 for b in books)
