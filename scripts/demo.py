"""`make demo`: the main job on the embedded default.

Until the embedded local engine lands (issue 7) this starts two simulated cards on 127.0.0.1, runs the main job
against them, and stops them.
"""

from __future__ import annotations

import sys

from orchestrator.cli import main
from orchestrator.sim.launch import SimFleet

prompt = sys.argv[1] if len(sys.argv) > 1 else "Write me a complete software engineering handbook"
with SimFleet(cards=2) as fleet:
    args = [prompt, "--parts", "3", "--chapters", "3", "--sections", "4"]
    for url in fleet.urls:
        args += ["--backend", url]
    sys.exit(main(args))
