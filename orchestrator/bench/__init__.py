"""The throughput ladder: load the servers at rising stream counts and read what they deliver from their counters.

ladder.py runs it (one level after another, the figures of each from the servers' counters), load.py is the load
generator (streams kept full through the job's own client), fit.py the step-time fit, report.py the tables,
ladder.csv and the SVG chart, compare.py ``handbook bench compare``. The command itself is
:mod:`orchestrator.cli.bench`.
"""

from .compare import compare, load_ladder
from .fit import fit_line, fit_step
from .ladder import DEFAULT_STREAMS, BenchSettings, run_ladder
from .report import chart_svg, ladder_table, stdout_console, write_outputs

__all__ = [
    "DEFAULT_STREAMS",
    "BenchSettings",
    "chart_svg",
    "compare",
    "fit_line",
    "fit_step",
    "ladder_table",
    "load_ladder",
    "run_ladder",
    "stdout_console",
    "write_outputs",
]
