"""A book that reads as one (issue 28): the same books written the reference's way and the default way, compared as
a reader would count it, on the embedded engine (or on any --backend).

    .venv/bin/python benchmarks/context_quality.py                       # 3 prompts x 2 ways, embedded engine
    .venv/bin/python benchmarks/context_quality.py --prompts "Write me a guide to sourdough" --excerpts 5
    .venv/bin/python benchmarks/context_quality.py --backend http://gpu1:8000/v1 --parts 8 --chapters 12 --sections 16
    .venv/bin/python benchmarks/context_quality.py --runs 3 --out /tmp/cq       # each book three times, summed up
    .venv/bin/python benchmarks/context_quality.py --summarize /tmp/cq44a /tmp/cq44b   # runs kept with --out

Each prompt is written twice through the real CLI, same shape (the embedded engine's default 3 x 3 x 4 unless
given), same profile and sampling:

    none      --context none --no-distinct-titles --no-repairs --no-stop-at-sign-off: each section asked with its
              titles alone and read to its end, nothing checked afterwards (the reference's way; before stop 43 its
              sections were read as outline's are, with no sign-off stop to have)
    outline   the defaults: each section request carries the book's brief, its part's chapter titles and its
              chapter's section titles; no title twice in the book; a section's stream stopped where it signs off;
              code that does not parse and near-duplicates asked again once

and counted from what each run left (outline.json, defects.json, stats.json):

    repeated titles    titles of the whole outline (book, parts, chapters, sections) equal after normalising
    near-dup pairs     pairs of sections whose text largely repeats (defects.json near_duplicate_sections)
    5-gram share       the mean share of a section's word 5-grams that another section of its chapter holds
                       (book/overlap.py; defects.json sibling_overlap): a title of the book named in the prose is a
                       name, which no 5-gram spans; first as book.md prints the sections (its printed: without the
                       model's talk to whoever asked, which a reader never meets), then as generated, and in
                       brackets every 5-gram counted (its every_gram)
    python broken      Python blocks that still do not parse, of those checked (``ast``)
    talk               sections where the model talks to whoever asked ("I hope this helps!", "I made several changes
                       to ..."; book/talk.py, defects.json assistant_talk), and the words of it: book.md leaves it out
    titles made        outline titles the planner made because the model's replies left a part or chapter short
                       (planning/made.filler_titles; counted from the job's warnings)
    whole job s        stats.json whole_job_s, and outline's against none's

With no --backend the script starts the embedded engine once (`handbook engine start`) and stops it at the end if it
started it, so engine start-up is in no job's time. ``--excerpts N`` prints up to N sentences of the outline books
that name another section of their chapter or a term of the brief: where a section visibly knows its siblings.

A small model's books differ from run to run (its outline too), by more than the two ways differ in one run: ``--runs
N`` writes every book N times (``--out DIR``: run k's books under DIR/run<k>) and ends with a summary over the runs,
per prompt, of each way's mean printed 5-gram share, in how many runs outline's was lower, outline's whole job against
none's (mean, largest, runs over 1.25), the loops cut and re-asked and the Python still broken. ``--summarize DIR...``
prints the same summary from runs kept before (each DIR holding a run's <i>-none and <i>-outline folders).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.book.checks import norm_title
from orchestrator.core.outline import Outline

PROMPTS = (
    "Write me a complete software engineering handbook",
    "Write me a beginner's guide to data analysis with Python",
    "Write me a field guide to the rivers of Europe",
)
WAYS = {
    "none": ["--context", "none", "--no-distinct-titles", "--no-repairs", "--no-stop-at-sign-off"],
    "outline": [],
}


def handbook(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout)


def engine_up() -> bool:
    """Start the embedded engine unless one runs; True when this script started it."""
    status = handbook("engine", "status", "--json")
    if status.returncode == 0 and json.loads(status.stdout or "{}").get("running"):
        return False
    started = handbook("engine", "start", timeout=900)
    if started.returncode != 0:
        sys.exit(f"context_quality: the embedded engine did not start: {started.stderr.strip()}")
    return True


def measure(out: Path) -> dict:
    stats = json.loads((out / "stats.json").read_text())
    defects = json.loads((out / "defects.json").read_text())
    outline = json.loads((out / "outline.json").read_text())
    code = defects["code_blocks"]
    py_checked = (code.get("checked") or {}).get("python")
    py_broken = (code.get("still_broken") or {}).get("python")
    if py_checked is None:  # a run without repairs: its defects count Python blocks failing ast.parse
        py_checked, py_broken = code["python_syntax_errors"]["of"], code["python_syntax_errors"]["count"]
    norms = [norm_title(t) for _, t in Outline.from_json(outline).titles()]
    return {
        "sections": stats["sections"],
        "failed": stats["failed_sections"] + stats["empty_sections"],
        "repeated_titles": len(norms) - len(set(norms)),
        "near_duplicates": defects["near_duplicate_sections"]["count"],
        "rewritten": defects["near_duplicate_sections"].get("repaired", 0),
        "five_gram_share": defects["sibling_overlap"]["mean"],
        "five_gram_share_printed": defects["sibling_overlap"].get("printed", defects["sibling_overlap"])["mean"],
        "five_gram_share_all": defects["sibling_overlap"].get("every_gram", defects["sibling_overlap"])["mean"],
        "python_checked": py_checked or 0,
        "python_broken": py_broken or 0,
        "code_repaired": sum((code.get("repaired") or {}).values()),
        "talk": defects.get("assistant_talk", {}).get("count", 0),
        "talk_words": defects.get("assistant_talk", {}).get("words", 0),
        "requests": stats["requests"],
        "tokens": stats["tokens_written"],
        "capped": stats["truncated_sections"],
        "signed_off": stats.get("signed_off_answers", 0),
        "loops_cut": defects["looping_sections"].get("cut", 0),
        "loops_reasked": defects["looping_sections"]["repaired"] - defects["looping_sections"].get("cut", 0),
        "whole_job_s": stats["whole_job_s"],
        "brief": outline.get("brief", ""),
    }


_MADE = re.compile(r"the other (\d+) are made from its title")


def titles_made(stderr: str) -> int:
    """How many outline titles the planner made from a node's own title (its warnings, planning/node.py)."""
    return sum(int(m.group(1)) for m in _MADE.finditer(stderr))


def excerpts(out: Path, limit: int) -> list[str]:
    """Sentences of a book that name another section of their chapter, or a term of the brief in quotes."""
    outline = json.loads((out / "outline.json").read_text())
    brief_terms = re.findall(r'"([^"]{3,40})"', outline.get("brief", ""))
    md = (out / "book.md").read_text()
    found: list[str] = []
    for p in outline["parts"]:
        for c in p["chapters"]:
            for title in c["sections"]:
                m = re.search(rf"^#### {re.escape(title)}\n(.*?)(?=^#{{2,4}} |\Z)", md, re.M | re.S)
                if not m:
                    continue
                others = [t for t in c["sections"] if t != title and len(t) > 6]
                for sentence in re.split(r"(?<=[.!?])\s+", m.group(1)):
                    low = sentence.lower()
                    hit = next((t for t in [*others, *brief_terms] if t.lower() in low), None)
                    if hit and len(sentence) < 400 and not sentence.lstrip().startswith(("#", "```", "|")):
                        found.append(f'[{c["title"]} / {title}, names "{hit}"] {sentence.strip()}')
                        break
    return found[:limit]


def table(rows: list[dict]) -> str:
    head = ("| prompt | way | sections | titles made | repeated titles | near-dup pairs (rewritten) | 5-gram share printed; generated (every 5-gram) | "
            "python broken / checked (repaired) | talk (words) | signed off | loops re-asked / cut | capped | requests | tokens | whole job s | "
            "vs none |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {r["prompt"]: r for r in rows if r["way"] == "none"}
    for r in rows:
        b = base.get(r["prompt"])
        ratio = f"{r['whole_job_s'] / b['whole_job_s']:.2f}" if b and b["whole_job_s"] else "-"
        lines.append(
            f"| {r['prompt'][:48]} | {r['way']} | {r['sections']} ({r['failed']} failed) | {r['titles_made']} | "
            f"{r['repeated_titles']} | "
            f"{r['near_duplicates']} ({r['rewritten']}) | {r['five_gram_share_printed']:.1%}; {r['five_gram_share']:.1%} ({r['five_gram_share_all']:.1%}) | "
            f"{r['python_broken']} / "
            f"{r['python_checked']} ({r['code_repaired']}) | {r['talk']} ({r['talk_words']:,}) | {r['signed_off']} | "
            f"{r['loops_reasked']} / {r['loops_cut']} | {r['capped']} | {r['requests']} | {r['tokens']:,} | {r['whole_job_s']:.1f} | {ratio} |")
    return "\n".join(lines)


def summary(runs: list[list[dict]]) -> str:
    """Per prompt, over the runs: each way's mean printed 5-gram share, the runs where outline's was lower, outline's
    whole job against none's, loops cut and re-asked, Python still broken (outline books)."""
    head = ("| prompt | runs | printed 5-gram share none → outline (mean) | outline lower in | whole job × none: mean, "
            "largest, over 1.25 | loops cut; re-asked (both ways) | python broken / checked (outline) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    prompts = list(dict.fromkeys(r["prompt"] for run in runs for r in run))
    for prompt in prompts:
        pairs = []
        for run in runs:
            ways = {r["way"]: r for r in run if r["prompt"] == prompt}
            if "none" in ways and "outline" in ways:
                pairs.append((ways["none"], ways["outline"]))
        if not pairs:
            continue
        ratios = [o["whole_job_s"] / n["whole_job_s"] for n, o in pairs if n["whole_job_s"]]
        lower = sum(o["five_gram_share_printed"] < n["five_gram_share_printed"] for n, o in pairs)
        cut = sum(r["loops_cut"] for pair in pairs for r in pair)
        asked = sum(r["loops_reasked"] for pair in pairs for r in pair)
        mean = statistics.mean
        lines.append(
            f"| {prompt[:48]} | {len(pairs)} | {mean(n['five_gram_share_printed'] for n, _ in pairs):.2%} → "
            f"{mean(o['five_gram_share_printed'] for _, o in pairs):.2%} | {lower} of {len(pairs)} | "
            f"{mean(ratios):.2f}, {max(ratios):.2f}, {sum(x > 1.25 for x in ratios)} | {cut}; {asked} | "
            f"{sum(o['python_broken'] for _, o in pairs)} / {sum(o['python_checked'] for _, o in pairs)} |")
    return "\n".join(lines)


def stored_run(folder: Path) -> list[dict]:
    """A run kept with --out: its books as rows, each labelled by its prompt's number and its first book's title."""
    rows = []
    for out in sorted(folder.glob("*-none")) + sorted(folder.glob("*-outline")):
        i, way = out.name.split("-", 1)
        rows.append({"prompt": f"#{i}", "way": way, "out": str(out), **measure(out), "titles_made": 0})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    ap.add_argument("--backend", action="append", default=[], help="repeatable (default: the embedded engine)")
    ap.add_argument("--parts", type=int)
    ap.add_argument("--chapters", type=int)
    ap.add_argument("--sections", type=int)
    ap.add_argument("--out", help="keep the books here (default: a temporary folder)")
    ap.add_argument("--excerpts", type=int, default=3, help="sentences to print that know their siblings")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="write every book this many times, then sum the runs up")
    ap.add_argument("--summarize", nargs="+", metavar="DIR", help="sum up runs kept with --out (writes nothing)")
    args = ap.parse_args()
    if args.summarize:
        missing = [d for d in args.summarize if not any(Path(d).glob("*-outline"))]
        if missing:
            sys.exit(f"context_quality: no run kept in {', '.join(missing)} (its <i>-none and <i>-outline folders)")
        print(summary([stored_run(Path(d)) for d in args.summarize]))
        return
    if args.runs < 1:
        sys.exit("context_quality: --runs must be 1 or more")
    shape = [x for k in ("parts", "chapters", "sections") if getattr(args, k)
             for x in (f"--{k}", str(getattr(args, k)))]
    backends = [x for u in args.backend for x in ("--backend", u)]
    started = False if args.backend else engine_up()
    runs: list[list[dict]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.out or tmp)
            for k in range(args.runs):
                base = root if args.runs == 1 else root / f"run{k + 1}"
                rows = []
                for i, prompt in enumerate(args.prompts):
                    for way, flags in WAYS.items():
                        out = base / f"{i + 1}-{way}"
                        print(f"[{prompt!r}, {way} ...]", file=sys.stderr, flush=True)
                        run = handbook(prompt, *shape, *backends, *flags, "--out", str(out), "--format", "md", "-q",
                                       "--fresh")
                        if run.returncode not in (0, 1):
                            sys.exit(f"context_quality: {prompt!r} ({way}) failed: {run.stderr.strip()[-400:]}")
                        rows.append({"prompt": prompt, "way": way, "out": str(out), **measure(out),
                                     "titles_made": titles_made(run.stderr)})
                runs.append(rows)
                print(table(rows))
            if args.runs > 1:
                print("\n" + summary(runs))
            for r in rows:
                if r["way"] == "outline":
                    print(f"\nbrief of {r['prompt']!r}: {r['brief'] or '(none)'}")
                    for e in excerpts(Path(r["out"]), args.excerpts):
                        print(f"  {e}")
            if args.json:
                print(json.dumps(runs if args.runs > 1 else rows, indent=2))
    finally:
        if started:
            handbook("engine", "stop")


if __name__ == "__main__":
    main()
