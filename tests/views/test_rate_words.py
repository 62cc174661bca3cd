"""How the views say a rate: the fleet's server-counted rate and each reader's share of it, one rounding for both."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console

from orchestrator.core.events import JobStarted, MetricsSample
from orchestrator.views.progress import TerminalProgress
from orchestrator.views.words import rate_num

A = "http://gpu1:8000/v1"


def test_a_share_of_the_rate_never_reads_above_the_rate():
    # One stream running: each reader gets the whole rate. Shown with one rounding for both, it can never read above
    # the rate it is a share of (a whole-number rate beside a one-decimal share read "188" against "188.2").
    for rate, streams in [(188.2, 1.0), (99.94, 1.0), (99.96, 1.0), (12.34, 1.0), (1880.4, 10.0), (250.0, 3.0)]:
        progress = TerminalProgress(Console(file=StringIO(), force_terminal=False), plain_interval=60)
        progress(JobStarted("p", (A,), {}, 0.0))
        servers = {A: {"tokens": 1000.0 + rate, "running": streams, "waiting": 0.0}}
        progress(MetricsSample(1.0, 1000.0, None, {A: {**servers[A], "tokens": 1000.0}}))
        progress(MetricsSample(2.0, 1000.0 + rate, rate, servers))
        shown = re.search(r"rate ([0-9,.]+) tok/s \(so far [0-9,.]+, each reader ([0-9,.]+) tok/s\)",
                          progress.plain_line())
        assert shown, progress.plain_line()
        total, each = (float(g.replace(",", "")) for g in shown.groups())
        assert 0 < each <= total
        assert total == pytest.approx(rate, abs=0.5) and each == pytest.approx(rate / streams, abs=0.5)


def test_rates_are_shown_in_tenths_below_a_hundred_and_whole_above():
    assert [rate_num(x) for x in (None, 0.0, 12.34, 99.94, 99.96, 188.2, 16931.4)] == [
        "-", "0.0", "12.3", "99.9", "100", "188", "16,931"]
