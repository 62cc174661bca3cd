"""SimFleet: start simulated cards in a subprocess for tests and benchmarks.

    with SimFleet(3, time_scale=2.0, no_json_schema=True) as fleet:
        fleet.urls          # ["http://127.0.0.1:P/v1", ...]
        fleet.power_urls    # ["http://127.0.0.1:P/dcgm/metrics#gpu=0", ...]: pair each with its url (--power)
        fleet.stats(0)      # GET /sim/stats of card 0
        fleet.metrics_text(0)

Keyword flags map to ``handbook sim`` flags: ``time_scale=2.0`` -> ``--time-scale 2.0``, ``no_json_schema=True``
-> ``--no-json-schema`` (False or None: left out), ``down_cards=[0, 2]`` -> ``--down-cards 0,2``,
``no_prefix_caching=True`` -> ``--no-prefix-caching`` (cards without the prefix cache, as before it).
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from ..core.osutil import port_free

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
_LIVE: set[SimFleet] = set()


def find_free_ports(n: int, rng: random.Random | None = None) -> int:
    """The first of ``n`` consecutive ports that are free on 127.0.0.1 right now."""
    rng = rng or random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        if all(port_free(p) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no run of {n} free consecutive ports found on 127.0.0.1")


def flags_to_argv(flags: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for k, v in flags.items():
        name = "--" + k.replace("_", "-")
        if v is True:
            argv.append(name)
        elif v is False or v is None:
            continue
        elif isinstance(v, (list, tuple, set)):
            argv += [name, ",".join(str(x) for x in v)]
        else:
            argv += [name, str(v)]
    return argv


class SimFleet:
    """Start N simulated cards in a subprocess (``python -m orchestrator sim ...``) on free 127.0.0.1 ports.

    Waits until every card answers ``/v1/models`` (RuntimeError with the subprocess output if not within
    ``startup_timeout``), and stops them on exit (SIGTERM to the process group, then SIGKILL).
    """

    def __init__(self, cards: int = 2, *, port: int | None = None, startup_timeout: float = 30.0,
                 **flags: Any):
        if cards < 1:
            raise ValueError("cards must be at least 1")
        self.cards = cards
        self.requested_port = port
        self.startup_timeout = startup_timeout
        self.flags = dict(flags)
        self.port: int | None = None
        self.urls: list[str] = []
        self.power_urls: list[str] = []
        self.process: subprocess.Popen | None = None
        self._lines: list[str] = []
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> SimFleet:
        if self.process is not None:
            return self
        attempts = 1 if self.requested_port is not None else 6
        last_error = ""
        for _ in range(attempts):
            port = self.requested_port if self.requested_port is not None else find_free_ports(self.cards)
            ok, last_error = self._try_start(port)
            if ok:
                return self
            if "already in use" not in last_error:
                break
        raise RuntimeError(f"simulator did not start: {last_error}")

    def argv(self, port: int) -> list[str]:
        return [sys.executable, "-m", "orchestrator", "sim", "--cards", str(self.cards), "--port", str(port),
                *flags_to_argv(self.flags)]

    def _try_start(self, port: int) -> tuple[bool, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = _REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        self._lines = []
        self._ready = threading.Event()
        argv = self.argv(port)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, text=True, bufsize=1)
        self.process = proc
        self._reader = threading.Thread(target=self._read, args=(proc,), daemon=True, name="simfleet-output")
        self._reader.start()
        _LIVE.add(self)
        deadline = time.monotonic() + self.startup_timeout
        while not self._ready.wait(0.05):
            if proc.poll() is not None:
                self._reader.join(2)
                out = self.output
                self._forget()
                return False, f"exit code {proc.returncode}: {' '.join(argv[1:])}\n{out}"
            if time.monotonic() > deadline:
                self.stop()
                return False, f"no ready line within {self.startup_timeout:g} s: {' '.join(argv[1:])}\n{self.output}"
        self.port = port
        self.urls = [f"http://127.0.0.1:{port + i}/v1" for i in range(self.cards)]
        self.power_urls = [f"http://127.0.0.1:{port + i}/dcgm/metrics#gpu={i}" for i in range(self.cards)]
        for i in range(self.cards):
            while True:
                try:
                    self._get(i, "/v1/models", timeout=2.0)
                    break
                except (OSError, urllib.error.URLError) as e:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        return False, f"card {i} does not answer /v1/models ({e})\n{self.output}"
                    time.sleep(0.05)
        return True, ""

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.append(line)
            if line.startswith("sim ready"):
                self._ready.set()

    def _forget(self) -> None:
        self.process = None
        _LIVE.discard(self)

    def stop(self) -> None:
        """Stop the cards: SIGTERM to the whole process group, then SIGKILL after 5 s."""
        proc = self.process
        if proc is None:
            return
        try:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            try:  # stray workers included
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            if self._reader is not None:
                self._reader.join(1)
            self._forget()

    @property
    def output(self) -> str:
        """Everything the simulator printed so far."""
        return "".join(self._lines)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- helpers ----------------------------------------------------------------------------------------------
    def url(self, i: int) -> str:
        return self.urls[i]

    def _root(self, i: int) -> str:
        return self.urls[i][: -len("/v1")]

    def _get(self, i: int, path: str, *, timeout: float = 5.0, method: str = "GET") -> bytes:
        req = urllib.request.Request(self._root(i) + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()

    def stats(self, i: int) -> dict:
        """GET /sim/stats of card ``i``."""
        return orjson.loads(self._get(i, "/sim/stats"))

    def all_stats(self) -> list[dict]:
        return [self.stats(i) for i in range(self.cards)]

    def metrics_text(self, i: int) -> str:
        """GET /metrics of card ``i`` (Prometheus text format)."""
        return self._get(i, "/metrics").decode()

    def dcgm_text(self, i: int) -> str:
        """GET /dcgm/metrics of card ``i`` (its dcgm-exporter-like power page)."""
        return self._get(i, "/dcgm/metrics").decode()

    def reset_max(self, i: int | None = None) -> None:
        """Reset max_in_flight (of card ``i``, or of every card)."""
        for k in range(self.cards) if i is None else [i]:
            self._get(k, "/sim/reset_max", method="POST")

    def generation_tokens(self) -> int:
        """Sum of the cards' generation-token counters."""
        return sum(s["generation_tokens"] for s in self.all_stats())


@atexit.register
def _stop_all() -> None:
    for f in list(_LIVE):
        f.stop()
