"""The layout workers: long-lived WeasyPrint processes (typeset/worker.py) and the queue their answers arrive on.

Used by the final layout (typeset/pdf.py) and by typesetting while writing (typeset/background.py), which hands its
pool to the final layout. The parent never imports WeasyPrint: it only sends jobs and reads answers.
"""

from __future__ import annotations

import os
import pickle
import queue
import site
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..core.errors import HandbookError
from .ipc import NICE_ENV, frame, read_frame

__all__ = ["WORKER_COMMAND", "WORKER_SILENCE_S", "Pool", "TypesetError", "Worker", "default_workers", "worker_env"]

WORKER_SILENCE_S = 900  # a chunk of the reference book takes ~6 s: this only catches a hung worker


class TypesetError(HandbookError):
    """A worker failed to lay out or draw its chunk."""

    exit_code = 1



def default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        n = os.cpu_count() or 1
    return max(1, n)


WORKER_COMMAND = (sys.executable, "-P", "-m", "orchestrator.typeset.worker")


def worker_env() -> dict[str, str]:
    """The environment a worker starts in: it must import this very copy of the package, whatever the parent's
    working directory. ``-P`` keeps the working directory off the worker's path (another checkout there cannot
    shadow us); the folder that holds this package goes first on PYTHONPATH, unless it is a site directory (an
    installed package: already on the path, and putting site-packages before the standard library could shadow
    it). A checkout imported through sys.path, as the benchmarks do, is found that way too."""
    root = str(Path(__file__).resolve().parents[2])
    site_dirs = {str(Path(d).resolve()) for d in (*site.getsitepackages(), site.getusersitepackages())}
    env = dict(os.environ)
    if root not in site_dirs:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class Worker:
    """A layout process: imports WeasyPrint once, then runs the jobs it is sent, one at a time.

    A plain subprocess rather than multiprocessing: nothing re-imports the caller's ``__main__`` (a script without
    an ``if __name__ == "__main__"`` guard stays safe), nothing is forked from a parent that may run threads, and
    each worker's memory is its own (its peak RSS is honest). The package's lazy ``__init__`` keeps the job
    machinery (rich, aiohttp, the client) out of it.
    """

    def __init__(self, wid: int, events: queue.Queue[tuple[int, Any]], env: dict[str, str]):
        self.wid = wid
        self.job: int | None = None
        self.retired = False  # replaced (dead, or killed for a chunk nobody needs): never sent a job again
        self.stderr_tail = b""
        self.proc = subprocess.Popen(
            WORKER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
            env=env,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr  # all three are pipes: for the type checker
        self._stdin, self._stdout, self._stderr = self.proc.stdin, self.proc.stdout, self.proc.stderr
        self._events = events
        threading.Thread(target=self._read, daemon=True, name=f"typeset-worker-{wid}").start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    def send(self, job: dict[str, Any]) -> None:
        self.job = job["index"]
        data = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._stdin.write(frame(data))
            self._stdin.flush()
        except OSError:  # the worker exited before it could take the job (a broken pipe)
            # Its reader may already have said it was gone, while it had no job: say it again now that it has one,
            # so that the job comes back as an "error" message at once (Pool.handle) instead of after the silence.
            self._events.put((self.wid, None))

    def _read(self) -> None:
        try:
            while (body := read_frame(self._stdout)) is not None:
                self._events.put((self.wid, pickle.loads(body)))
        finally:
            self._events.put((self.wid, None))  # the worker is gone

    def _drain_stderr(self) -> None:
        for chunk in iter(lambda: self._stderr.read(4096), b""):
            self.stderr_tail = (self.stderr_tail + chunk)[-4000:]

    def close(self, kill: bool = False) -> None:
        try:
            if kill:
                self.proc.kill()
            else:
                self._stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Pool:
    """The layout workers and the one queue their messages arrive on. ``nice`` > 0: the workers lower their own
    priority first (typesetting while the job is still writing must never take a core from the client). Whoever
    owns the pool may put its own messages on ``events`` with a negative worker id (typeset/background.py)."""

    def __init__(self, n: int, nice: int = 0, events: queue.Queue[tuple[int, Any]] | None = None):
        self.events: queue.Queue[tuple[int, Any]] = events if events is not None else queue.Queue()
        self.workers: list[Worker] = []
        self.peak_rss: dict[int, float] = {}
        self.sent: dict[int, float] = {}  # job index -> when it was sent (time.monotonic())
        self.add(n, nice)

    def add(self, n: int, nice: int = 0) -> None:
        """Start ``n`` more workers (a new worker id each: a replaced worker's last message stays its own)."""
        env = worker_env()
        env.pop(NICE_ENV, None)  # never inherited: only the background asks for it
        if nice > 0:
            env[NICE_ENV] = str(nice)
        self.workers += [Worker(len(self.workers) + i, self.events, env) for i in range(n)]

    def current(self) -> list[Worker]:
        """The workers not retired and still running."""
        return [w for w in self.workers if not w.retired and w.proc.poll() is None]

    def idle(self) -> list[Worker]:
        return [w for w in self.current() if w.job is None]

    def retire(self, w: Worker) -> None:
        """Take ``w`` out of service, killing it if it runs: its job (if any) comes back as an "error" message."""
        w.retired = True
        if w.proc.poll() is None:
            w.proc.kill()

    def busy(self) -> bool:
        return any(w.job is not None for w in self.workers)

    def messages(self) -> list[tuple[str, int, Any]]:
        """Block until at least one message; a worker that died mid-job becomes an "error" message."""
        try:
            items = [self.events.get(timeout=WORKER_SILENCE_S)]
        except queue.Empty:
            raise TypesetError(f"a layout worker said nothing for {WORKER_SILENCE_S} s; gave up") from None
        while True:
            try:
                items.append(self.events.get_nowait())
            except queue.Empty:
                break
        return [m for wid, msg in items for m in self.handle(wid, msg)]

    def send(self, w: Worker, job: dict[str, Any]) -> None:
        self.sent[job["index"]] = time.monotonic()
        w.send(job)

    def handle(self, wid: int, msg: Any) -> list[tuple[str, int, Any]]:
        """One queue item as messages: a worker's own, an "error" for a worker that died mid-job, or nothing (a
        worker that exited idle; an owner's message, which is the owner's to read)."""
        out: list[tuple[str, int, Any]] = []
        if wid >= 0:
            w = self.workers[wid]
            if msg is None:
                if w.job is not None:
                    w.proc.wait(5)
                    tail = w.stderr_tail.decode("utf-8", "replace").strip().splitlines()
                    out.append(("error", w.job, (f"worker exited with code {w.proc.returncode}: "
                                               f"{tail[-1] if tail else 'no message'}")))
                    w.job = None
                return out
            if msg[0] in ("done", "error"):
                w.job = None
                if msg[0] == "done":
                    self.peak_rss[wid] = max(self.peak_rss.get(wid, 0.0), msg[2]["peak_rss_mb"])
                    msg[2]["t_sent"] = self.sent.get(msg[1], 0.0)
                    msg[2]["t_done"] = time.monotonic()
            out.append(msg)
        return out

    def close(self, kill: bool = False) -> None:
        """Stop the workers: an idle one is asked to exit (and waited for), a busy one is killed when ``kill``."""
        for w in self.workers:
            w.close(kill=kill and w.job is not None)
