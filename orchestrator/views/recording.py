"""A recording of a run: its event stream, timestamped and compressed, in ``OUT/recording.jsonl.gz``.

``handbook ... --record`` (the job, ``plan`` and ``write``) adds a :class:`Recorder` to the job's consumers and
asks for the text deltas; ``handbook replay OUT`` (views/replay.py) plays it back to the live feed. A library caller
passes ``Recorder(path)`` in ``on_event`` with ``deltas=True``.

The file is gzip'd JSON lines, one record per event: ``{"k": kind, "t": seconds since the run's first event, ...the
event's fields}`` (every monotonic time in it, a reply's included, is made relative to that first event). What
keeps it small (``benchmarks/recording_size.py`` measures it on the published take):

* **deltas are coalesced** per node over ``coalesce_s`` (0.1 s, the feed's own flush interval: a replay shows the
  text in the steps the live page did), and always before that node's next event, so a node's text arrives
  before its finish, and before the next attempt's start;
* **a finished node's text is not stored twice**: when its reply's text is exactly what its recorded deltas
  said, the record carries ``"tx": 1`` instead, and the reader puts the text back.

It is written while the run goes to ``recording.jsonl.gz.part`` (flushed about every second, so a killed run
leaves a readable prefix) and renamed to ``recording.jsonl.gz`` when the run ends; a write that fails (a full
disk) stops the recording, says so once on stderr, and never the job.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import sys
import time
import typing
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..core.events import Delta, Event, JobFinished, NodeFailed, NodeFinished, NodeStarted
from ..core.outline import Outline
from ..core.reply import Reply
from ..core.states import NodeKind

__all__ = ["RECORDING_FILE", "Recorder", "find_recording", "read_recording"]

RECORDING_FILE = "recording.jsonl.gz"
COALESCE_S = 0.1
FLUSH_S = 1.0

_KINDS: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(Event)}  # every event the job emits
_REPLY_TIMES = ("t_start", "t_first", "t_end")


class Recorder:
    """The event consumer that writes a recording to ``path`` (a folder: ``path/recording.jsonl.gz``).

    The file is opened at the first event (the out folder exists by then) and closed, and renamed into place, at
    :class:`~orchestrator.core.events.JobFinished` or :meth:`close`. ``records``, ``events`` and ``bytes_raw`` say
    what it wrote (the size on disk is the file's).
    """

    def __init__(self, path: str | os.PathLike, *, coalesce_s: float = COALESCE_S, level: int = 6) -> None:
        p = Path(path)
        self.path = p / RECORDING_FILE if p.is_dir() or not p.suffix else p
        self.coalesce_s = float(coalesce_s)
        self.level = int(level)
        self.events = 0
        self.records = 0
        self.bytes_raw = 0
        self.error: str | None = None
        self._file: gzip.GzipFile | None = None
        self._t0: float | None = None
        self._flushed = 0.0
        self._pending: dict[str, list[Any]] = {}  # path -> [t of its first delta, t of its last, [texts]]
        self._said: dict[str, list[str]] = {}  # path -> the text its current attempt's deltas said
        self._closed = False

    @property
    def part(self) -> Path:
        return self.path.with_name(self.path.name + ".part")

    def __call__(self, event: Event) -> None:
        if self._closed or self.error is not None:
            return
        try:
            self._take(event)
        except OSError as e:
            self._fail(e)

    def close(self) -> None:
        """Write what is pending and put the file in place (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._file is None or self.error is not None:
            return
        try:
            for path in list(self._pending):
                self._flush_deltas(path)
            self._file.close()
            os.replace(self.part, self.path)
        except OSError as e:
            self._fail(e)
        finally:
            self._file = None

    # -- writing ----------------------------------------------------------------------------------------------

    def _take(self, event: Event) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = gzip.open(self.part, "wb", compresslevel=self.level)
            self._t0 = event.t
        self.events += 1
        if isinstance(event, Delta):
            self._delta(event)
            return
        path = getattr(event, "path", None)
        if path is not None:
            self._flush_deltas(path)
        record = self._record(event)
        if isinstance(event, NodeStarted):
            self._said[event.path] = []
        elif isinstance(event, NodeFinished | NodeFailed):
            said = self._said.pop(event.path, None)
            if isinstance(event, NodeFinished) and said is not None and "".join(said) == event.reply.text:
                record["reply"]["text"] = ""
                record["tx"] = 1
        self._write(record)
        if isinstance(event, JobFinished):
            self.close()
        elif time.monotonic() - self._flushed >= FLUSH_S:
            assert self._file is not None
            self._file.flush()
            self._flushed = time.monotonic()

    def _delta(self, e: Delta) -> None:
        pending = self._pending.get(e.path)
        if pending is not None and e.t - pending[0] >= self.coalesce_s:
            self._flush_deltas(e.path)
            pending = None
        if pending is None:
            self._pending[e.path] = [e.t, e.t, [e.text]]
        else:
            pending[1] = e.t
            pending[2].append(e.text)
        self._said.setdefault(e.path, []).append(e.text)

    def _flush_deltas(self, path: str) -> None:
        pending = self._pending.pop(path, None)
        if pending is not None:
            self._write({"k": "Delta", "t": self._rel(pending[1]), "path": path, "text": "".join(pending[2])})

    def _record(self, event: Event) -> dict[str, Any]:
        record: dict[str, Any] = {"k": type(event).__name__}
        for f in dataclasses.fields(event):
            v = getattr(event, f.name)
            if f.name == "t":
                v = self._rel(v)
            elif isinstance(v, Reply):
                v = dataclasses.asdict(v)
                for name in _REPLY_TIMES:
                    if v[name] is not None:
                        v[name] = self._rel(v[name])
            elif isinstance(v, Outline):
                v = v.to_json()
            record[f.name] = v
        return record

    def _rel(self, t: float) -> float:
        assert self._t0 is not None
        return round(t - self._t0, 4)

    def _write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        line = orjson.dumps(record) + b"\n"
        self._file.write(line)
        self.records += 1
        self.bytes_raw += len(line)

    def _fail(self, e: OSError) -> None:
        self.error = f"cannot write {self.part}: {e.strerror or e}"
        print(f"handbook: warning: the recording stops: {self.error}; the job goes on", file=sys.stderr)
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


# -- reading ------------------------------------------------------------------------------------------------------


def find_recording(out: str | os.PathLike) -> Path:
    """The recording of ``out`` (a folder or the file itself): the finished file, else what a killed run left.
    Raises FileNotFoundError naming what was looked for."""
    p = Path(out)
    if p.is_file():
        return p
    for candidate in (p / RECORDING_FILE, p / (RECORDING_FILE + ".part")):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no recording in {p} (looked for {RECORDING_FILE}; run the job with --record)")


def read_recording(path: str | os.PathLike, base: float = 0.0) -> Iterator[Event]:
    """The events of a recording, in order, each time ``base`` + its offset. A file cut short (a killed run)
    yields what it holds and ends; a line that is not a record raises ValueError naming the line."""
    said: dict[str, list[str]] = {}
    with gzip.open(path, "rb") as f:
        n = 0
        while True:
            try:
                line = f.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile):
                return  # the run was cut: what it wrote before is whole
            if not line:
                return
            n += 1
            try:
                record = orjson.loads(line)
                event = _event(record, base)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                if not line.endswith(b"\n"):
                    return  # the last line of a cut file
                raise ValueError(f"{path}: line {n} is not a recorded event ({e})") from None
            yield _with_text(event, record, said)


def _event(record: dict[str, Any], base: float) -> Event:
    cls = _KINDS[record["k"]]
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in record:
            continue
        v = record[f.name]
        if f.name == "t":
            v = base + float(v)
        elif f.name == "kind":
            v = NodeKind(v)
        elif f.name == "reply":
            v = Reply(**{k: (base + x if k in _REPLY_TIMES and x is not None else x) for k, x in v.items()})
        elif f.name == "outline":
            v = Outline.from_json(v)
        elif isinstance(v, list):  # JSON has no tuple: JobStarted.backends, ProbeStarted.levels
            v = tuple(v)
        values[f.name] = v
    return cls(**values)


def _with_text(event: Event, record: dict[str, Any], said: dict[str, list[str]]) -> Event:
    """Keep each node's recorded text, and put it back into the finished reply that left it out (``tx``)."""
    if isinstance(event, Delta):
        said.setdefault(event.path, []).append(event.text)
    elif isinstance(event, NodeStarted):
        said[event.path] = []
    elif isinstance(event, NodeFinished | NodeFailed):
        text = "".join(said.pop(event.path, ()))
        if isinstance(event, NodeFinished) and record.get("tx"):
            return dataclasses.replace(event, reply=dataclasses.replace(event.reply, text=text))
    return event
