"""Make a small book from Python against simulated cards this script starts itself.

    .venv/bin/python examples/library_call.py
"""

from orchestrator import Backend, Event, Settings, generate
from orchestrator.sim.launch import SimFleet


def show(e: Event) -> None:  # every event but the streamed text (that takes deltas=True)
    print(type(e).__name__, getattr(e, "path", ""))


with SimFleet(cards=2) as fleet:
    result = generate(
        "Write me a complete software engineering handbook",
        backends=[Backend(url, cap=64) for url in fleet.urls],
        settings=Settings(parts=2, chapters=3, sections=4, formats=("md",)),
        out="handbook-out/library-call",
        on_event=show,
    )
print(result.stats["sections"], "sections,", result.stats["words"], "words, complete:", result.complete)
print("book:", result.paths["md"])
