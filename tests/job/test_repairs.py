"""Checked afterwards, asked again once (job/repairs.py), through the real CLI against a scripted server: a section
whose Python does not parse is sent back with the error and its line and replaced only by a text that parses (and
keeps its code, in any language: a re-ask that drops the example repairs nothing, one that re-tags a shell session
``bash`` repairs it); the
later of two near-duplicate sections is asked again, told what the other says, and replaced only by a text that no
longer repeats it; defects.json and defects.md say so; a rerun repeats no repair; --no-repairs asks nothing more."""

from __future__ import annotations

import json
import subprocess

from local_http import env, job_cmd
from scripted_book import SHAPE, book_answer, sections_of
from scripted_openai import Answer, Request, ScriptedServer, prose

BROKEN = "```python\ndef f(:\n    return 1\n```"
FIXED = "```python\ndef f(x):\n    return x\n```"
SHELL = "```python\n$ pip install requests\n```"
SAME = ("Caching keeps a copy of data close to where it is used so that the next read is fast. A cache has a size, "
        "and when it is full something must leave: the least recently used entry is the usual choice. Stale entries "
        "are the price of speed, so every cache needs a rule for when its copy stops being true. Measure the hit "
        "rate before and after, because a cache that misses costs more than no cache at all.")


def _answer(req: Request) -> Answer:
    if req.kind == "section":
        last = req.body["messages"][-1]["content"]
        if req.title == "Basics 1":  # broken, then fixed when told
            if "does not parse" in last:
                assert "line 4" in last or "line 3" in last, last  # the error's line within the section
                return Answer(f"{prose(req.title)}\n\n{FIXED}\n\nThat is all.")
            return Answer(f"{prose(req.title)}\n\n{BROKEN}\n\nThat is all.")
        if req.title == "Basics 3":  # a shell session tagged Python, re-tagged bash when told: a repair
            if "does not parse" in last:
                return Answer(f"{prose(req.title)}\n\n{SHELL.replace('```python', '```bash')}\n\nThat is all.")
            return Answer(f"{prose(req.title)}\n\n{SHELL}\n\nThat is all.")
        if req.title == "Basics 2":  # broken, then told: drops the code instead (no repair: the first text kept)
            if "does not parse" in last:
                return Answer(f"{prose(req.title)}\n\nThe example is left out.")
            return Answer(f"{prose(req.title)}\n\n{BROKEN}\n\nDone.")
        if req.title in ("Practice 1", "Practice 2"):  # the same text: Practice 2 is asked again
            if "Another section" in last:
                assert '"Practice 1", already says: "This section is about Practice 1."' in last, last
                return Answer(prose(req.title))
            return Answer(f"This section is about {req.title}. {SAME}")
    return book_answer(req)


def test_broken_code_and_a_near_duplicate_are_asked_again_once_and_a_rerun_repeats_neither(tmp_path):
    out = tmp_path / "o"
    cmd = job_cmd("A test book", [], out, *SHAPE, "--format", "md", "--repairs")
    with ScriptedServer(_answer) as srv:
        run = subprocess.run([*cmd, "--backend", srv.url], capture_output=True, text=True, timeout=120, env=env())
        assert run.returncode == 0, run.stderr
        asks = [(r.title, r.nth) for r in srv.of("section")]
        assert sorted(t for t, n in asks if n == 2) == ["Basics 1", "Basics 2", "Basics 3", "Practice 2"]
        assert max(n for _, n in asks) == 2, "a repair was asked more than once"
        first = json.loads((out / "stats.json").read_text())
        # the four re-asks are counted as such: requests, not sections written (8, one per section)
        assert first["reask_requests"] == 4 and first["reask_tokens"] > 0
        assert sum(b["sections"] for b in first["per_backend"]) == 8
        assert first["requests"] == first["planning_requests"] + 8 + 4
        before = len(srv.requests)
        again = subprocess.run([*cmd, "--backend", srv.url], capture_output=True, text=True, timeout=120, env=env())
        assert again.returncode == 0, again.stderr
        assert len(srv.requests) == before, "the rerun asked again"
    book = sections_of((out / "book.md").read_text())
    assert "def f(x):" in book["Basics 1"] and "def f(:" not in book["Basics 1"]
    assert "def f(:" in book["Basics 2"]
    assert "```bash\n$ pip install requests" in book["Basics 3"]
    # still broken after its re-ask: printed with a note saying so; the repaired one without
    assert "> **Note:** the Python above does not parse (line 1: SyntaxError" in book["Basics 2"]
    assert "Note:" not in book["Basics 1"]
    assert "Caching keeps" in book["Practice 1"] and "Caching keeps" not in book["Practice 2"]
    stats = json.loads((out / "stats.json").read_text())  # the rerun's: it asked nothing
    assert stats["requests"] == 0 and stats["reask_requests"] == 0
    d = json.loads((out / "defects.json").read_text())
    code = d["code_blocks"]
    assert code["repaired"] == {"python": 2} and code["still_broken"] == {"python": 1}
    assert code["checked"]["python"] == 2
    assert d["near_duplicate_sections"]["count"] == 0 and d["near_duplicate_sections"]["repaired"] == 1
    md = (out / "defects.md").read_text()
    assert "python 1 of 2; 2 sections repaired by a re-ask" in md
    assert "1 sections rewritten" in md


def test_without_repairs_nothing_is_asked_again(tmp_path):
    out = tmp_path / "o"
    with ScriptedServer(_answer) as srv:
        run = subprocess.run(job_cmd("A test book", [srv.url], out, *SHAPE, "--no-repairs"), capture_output=True,
                             text=True, timeout=120, env=env())
        assert run.returncode == 0, run.stderr
        assert all(r.nth == 1 for r in srv.of("section"))
    d = json.loads((out / "defects.json").read_text())
    assert d["code_blocks"]["still_broken"] == {"python": 3} and d["code_blocks"]["repaired"] == {}
    assert d["near_duplicate_sections"]["count"] == 1 and d["near_duplicate_sections"]["repaired"] == 0
