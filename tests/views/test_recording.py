"""A recording keeps the run's event stream: read back, it gives the same events in the same order (each node's
text whole, every time at its offset), coalesced and without a finished text stored twice; a file cut short reads
to where it stops; a recording that cannot be written stops itself, never the job; `handbook replay` of nothing is
one line and exit 2."""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
import sys
import time

import anyio
import pytest
from feed_synth import synthetic_job

from orchestrator.core.events import Delta, JobFinished, JobStarted, NodeFinished, NodeStarted, ProbeStarted
from orchestrator.core.reply import Reply
from orchestrator.core.states import NodeKind
from orchestrator.views.recording import RECORDING_FILE, Recorder, find_recording, read_recording
from orchestrator.views.replay import replay

pytestmark = pytest.mark.anyio


def _texts(events) -> dict[tuple[str, int], str]:
    """What each node's attempts said, by (path, attempt number counted from its starts)."""
    out: dict[tuple[str, int], str] = {}
    attempt: dict[str, int] = {}
    for e in events:
        if isinstance(e, NodeStarted):
            attempt[e.path] = attempt.get(e.path, 0) + 1
        elif isinstance(e, Delta):
            key = (e.path, attempt.get(e.path, 0))
            out[key] = out.get(key, "") + e.text
    return out


_TIMES = ("t", "t_start", "t_first", "t_end")


def _plain(e, dt: float) -> dict:
    """``e`` as a dict, every time in it moved by ``dt`` and rounded to the millisecond (a recording keeps
    0.1 ms), so that two events compare equal when they differ by less than that."""
    d = dataclasses.asdict(e)
    d["type"] = type(e).__name__
    if "outline" in d:
        d["outline"] = e.outline.to_json()
    for holder in (d, d.get("reply") or {}):
        for k in _TIMES:
            if holder.get(k) is not None:
                holder[k] = round(holder[k] + dt, 3)
    return d


def _close(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for holder_x, holder_y in ((x, y), (x.get("reply") or {}, y.get("reply") or {})):
            for k in _TIMES:
                if holder_x.get(k) is not None:
                    assert abs(holder_x[k] - holder_y[k]) <= 0.0011, (x, y)
                    holder_x[k] = holder_y[k]
        assert x == y


def _recorded(tmp_path):
    """(the events seen, the Recorder, a consumer giving each event to both)."""
    seen: list = []
    rec = Recorder(tmp_path)

    def both(e):
        seen.append(e)
        rec(e)

    return seen, rec, both


async def test_a_recording_reads_back_as_the_run_it_kept(tmp_path):
    seen, rec, both = _recorded(tmp_path)
    stats = await synthetic_job(both, parts=2, chapters=2, sections=3, cap=3, words=90, chunk_delay=0.004,
                                retry_path="1.2.1", hostile_path="1.1.2")
    assert (tmp_path / RECORDING_FILE).is_file() and not (tmp_path / (RECORDING_FILE + ".part")).exists()
    back = list(read_recording(tmp_path / RECORDING_FILE, base=100.0))

    # every event but the deltas comes back, in order, equal to what the run emitted (times moved to the base)
    t0 = seen[0].t
    _close([_plain(e, 0.0) for e in back if not isinstance(e, Delta)],
           [_plain(e, 100.0 - t0) for e in seen if not isinstance(e, Delta)])
    assert isinstance(back[0], JobStarted) and isinstance(back[-1], JobFinished)
    assert back[-1].stats == stats

    # the text of every attempt is whole; the deltas were coalesced into fewer records
    assert _texts(back) == _texts(seen)
    n_deltas = sum(isinstance(e, Delta) for e in seen)
    assert sum(isinstance(e, Delta) for e in back) < n_deltas
    assert rec.events == len(seen) and rec.records == len(back)

    # a node's text arrives before its finish: the texts the replies carry are what the deltas said
    said: dict[str, str] = {}
    for e in back:
        if isinstance(e, NodeStarted):
            said[e.path] = ""
        elif isinstance(e, Delta):
            said[e.path] = said.get(e.path, "") + e.text
        elif isinstance(e, NodeFinished) and e.kind == NodeKind.SECTION:
            assert e.reply.text == said[e.path]
    # and a finished text was not stored twice
    raw = gzip.decompress((tmp_path / RECORDING_FILE).read_bytes()).decode()
    assert raw.count('"tx":1') == sum(1 for e in seen if isinstance(e, NodeFinished) and e.reply.text)


async def test_a_recording_of_a_run_that_probed_reads_back_and_replays(tmp_path):
    # `handbook plan --record`: the forecast's probe is the recording's first event, before JobStarted
    seen, _, both = _recorded(tmp_path)
    t = time.monotonic()
    both(ProbeStarted((3, 12), 2, t - 2.0))
    await synthetic_job(both, parts=1, chapters=1, sections=2, cap=2, words=40, chunk_delay=0.001)
    back = list(read_recording(tmp_path / RECORDING_FILE, base=100.0))
    assert back[0] == ProbeStarted((3, 12), 2, 100.0) and isinstance(back[1], JobStarted)
    assert 101.9 < back[1].t < 103.0  # the probe's seconds stay before the job
    assert back[1].backends == seen[1].backends and isinstance(back[1].backends, tuple)
    assert sum(isinstance(e, NodeFinished) for e in back) == sum(isinstance(e, NodeFinished) for e in seen)
    cmd = [sys.executable, "-m", "orchestrator", "replay", str(tmp_path), "--speed", "100", "--feed-linger", "0", "-q"]
    proc = await anyio.to_thread.run_sync(lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=120))
    assert proc.returncode == 0, proc.stderr


async def test_a_finished_text_unlike_its_deltas_is_kept_whole(tmp_path):
    rec = Recorder(tmp_path / "r")
    t = 50.0
    reply = Reply("Trimmed text.", "stop", 10, 4, "http://b/v1", t, t + 0.1, t + 0.3)
    for e in (JobStarted("p", ("http://b/v1",), {}, t),
              NodeStarted("1.1.1", NodeKind.SECTION, "S", "http://b/v1", 1, t),
              Delta("1.1.1", "  Trimmed ", t + 0.1), Delta("1.1.1", "text.  ", t + 0.15),
              NodeFinished("1.1.1", NodeKind.SECTION, "S", reply, t + 0.3),
              JobFinished({"sections": 1}, True, t + 0.4)):
        rec(e)
    back = list(read_recording(find_recording(tmp_path / "r")))
    finished = [e for e in back if isinstance(e, NodeFinished)]
    assert finished[0].reply.text == "Trimmed text."
    assert "".join(e.text for e in back if isinstance(e, Delta)) == "  Trimmed text.  "
    assert [round(e.t, 3) for e in back] == [0.0, 0.0, 0.15, 0.3, 0.4]  # the coalesced delta at its last piece's time


async def test_a_recording_cut_short_reads_to_where_it_stops(tmp_path):
    rec = Recorder(tmp_path)
    await synthetic_job(rec, parts=2, chapters=2, sections=3, cap=3, words=90, chunk_delay=0.002)
    whole = list(read_recording(tmp_path / RECORDING_FILE))
    data = (tmp_path / RECORDING_FILE).read_bytes()
    cut = tmp_path / "cut" / (RECORDING_FILE + ".part")  # what a killed run leaves
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) // 2])
    assert find_recording(cut.parent) == cut
    prefix = list(read_recording(cut))
    assert 0 < len(prefix) < len(whole)
    assert [type(e) for e in prefix] == [type(e) for e in whole[: len(prefix)]]
    done = await replay(cut, [lambda e: None], speed=1000.0)
    assert done.events == len(prefix) and not done.finished


async def test_a_recording_that_cannot_be_written_stops_itself_not_the_job(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    rec = Recorder(blocker / "out")  # its folder cannot be made: the parent is a file
    stats = await synthetic_job(rec, parts=1, chapters=1, sections=2, cap=2, words=40, chunk_delay=0.001)
    assert stats["tokens_written"] > 0
    assert rec.error is not None and "cannot write" in rec.error
    assert capsys.readouterr().err.count("the recording stops") == 1


async def test_replay_keeps_the_run_s_pace_divided_by_the_speed(tmp_path):
    rec = Recorder(tmp_path)
    t = 10.0
    rec(JobStarted("p", (), {}, t))
    rec(JobFinished({}, True, t + 0.6))
    rec.close()
    t0 = anyio.current_time()
    done = await replay(tmp_path, [lambda e: None], speed=2.0)
    took = anyio.current_time() - t0
    assert done.finished and done.events == 2 and abs(done.run_s - 0.6) < 1e-6
    assert 0.25 <= took  # 0.6 s of run at 2x: never faster than the speed says


def test_replay_without_a_recording_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "orchestrator", "replay", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no recording in" in r.stderr
    r = subprocess.run([sys.executable, "-m", "orchestrator", "replay", str(tmp_path), "--speed", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
