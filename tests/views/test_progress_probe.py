"""Terminal progress while the forecast probes the servers, before the job starts (ProbeStarted)."""

from __future__ import annotations

import time
from io import StringIO

from rich.console import Console

from orchestrator.core.events import JobStarted, LevelPlanned, ProbeStarted
from orchestrator.views.progress import TerminalProgress

A = "http://gpu1:8000/v1"


def test_the_forecasts_probe_is_shown_before_the_job_starts_and_is_not_on_its_clock():
    # `handbook plan` on the embedded engine probes step times for ~15 s before planning; a --pages plan up to a few
    # minutes. Before ProbeStarted the plain line read "[0s] planning (0 planning requests done)" all that while.
    out = StringIO()
    progress = TerminalProgress(Console(file=out, force_terminal=False), plain_interval=60)
    t = time.monotonic()
    progress(ProbeStarted((9, 36), 1, t - 12.0))
    line = progress.plain_line()
    assert line.startswith("[   12s]") and "forecast: measuring step times at 9 then 36 streams" in line, line
    assert "planning" not in line
    progress.start()
    progress(JobStarted("p", (A,), {}, t))  # the job's clock starts here, not at the probe
    progress(LevelPlanned(1, 3, t + 1.0))
    line = progress.plain_line()
    assert line.startswith("[    1s]") and "planning L1=3" in line and "measuring" not in line, line
    assert progress.state.probe is None and progress.state.elapsed == 1.0
    progress.stop()
    text = out.getvalue()
    assert "forecast: measuring the step time of 1 backend at 9 then 36 streams at once, before the job starts" in text
    # the live display says it too, in its planning row
    live = TerminalProgress(Console(file=StringIO(), force_terminal=True, width=160))
    live(ProbeStarted((16, 64, 256), 6, t))
    console = Console(file=StringIO(), width=160)
    console.print(live._render())
    assert "measuring step times for the forecast (16 then 64 then 256 streams)" in console.file.getvalue()
