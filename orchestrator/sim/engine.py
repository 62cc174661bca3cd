"""The engine model of one simulated GPU card: continuous batching with a linear step cost.

One loop per card. A decoding step costs ``(step_ms + per_stream_ms * running) * time_scale`` milliseconds, plus
``prefill_ms_per_token * time_scale`` for every prompt token admitted in that step. Every running stream gets one
token per step. At most ``max_seqs`` streams run; fewer when their KV reservation (prompt tokens plus the tokens
the stream will generate) would overflow ``kv_tokens``. The rest wait, first in first out.

The hot path is integer arithmetic: streams are bucketed by the step they were admitted in modulo the stream
interval, so a step touches only the streams that emit a chunk in it (``running / stream_interval`` of them) and
the streams that finish in it. Steps are scheduled on absolute deadlines, so the modelled rate holds over time
as long as the process keeps up; when it does not, the slip is recorded in ``late_s``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .power import PowerMeter

# vLLM's buckets (vllm/v1/metrics/loggers.py) for vllm:time_to_first_token_seconds, ...
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# ... vllm:inter_token_latency_seconds (one observation per running stream per step, the step's wall time) ...
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
# ... and vllm:e2e_request_latency_seconds (arrival to the last token, of requests that finished).
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class Hist:
    """One histogram's plain counts (per bucket, not cumulative; the last is +Inf), read at scrape time."""

    __slots__ = ("bounds", "counts", "n", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += times  # first bucket with seconds <= bound
        self.total += seconds * times
        self.n += times

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' buckets: (le, cumulative count), +Inf last."""
        out, acc = [], 0
        for b, k in zip(self.bounds, self.counts, strict=False):
            acc += k
            out.append((repr(float(b)), float(acc)))
        out.append(("+Inf", float(self.n)))
        return out


@dataclass(frozen=True)
class EngineConfig:
    step_ms: float = 12.94
    per_stream_ms: float = 0.2451
    max_seqs: int = 512
    kv_tokens: int = 173_000
    prefill_ms_per_token: float = 0.02
    stream_interval: int = 4
    time_scale: float = 1.0

    def step_s(self, running: int, prefill_tokens: int = 0) -> float:
        """Wall seconds of one step with ``running`` streams and ``prefill_tokens`` newly admitted prompt tokens."""
        ms = self.step_ms + self.per_stream_ms * running + self.prefill_ms_per_token * prefill_tokens
        return ms * self.time_scale / 1000.0

    def model_tok_s(self, streams: int) -> float:
        """Steady-state decode rate in model time (time_scale 1) with ``streams`` running."""
        if streams <= 0:
            return 0.0
        return streams * 1000.0 / (self.step_ms + self.per_stream_ms * streams)


class Stream:
    """One request inside the engine. ``count`` is the number of tokens generated so far."""

    __slots__ = (
        "admit",
        "cancelled",
        "count",
        "done",
        "n",
        "need",
        "prompt_tokens",
        "sink",
        "state",
        "t_arrival",
        "t_first",
        "waiter",
    )

    def __init__(self, prompt_tokens: int, n: int):
        if n < 1:
            raise ValueError("a stream generates at least one token")
        self.prompt_tokens = prompt_tokens
        self.n = n
        self.need = prompt_tokens + n  # KV reservation
        self.admit = -1
        self.count = 0
        self.done = False
        self.cancelled = False
        self.waiter: asyncio.Future | None = None
        self.t_arrival = time.monotonic()
        self.t_first: float | None = None
        self.state = 0  # 0 new, 1 waiting, 2 running, 3 finished/cancelled
        # Called synchronously by the engine whenever ``count`` advances (or the stream finishes), instead of
        # waking the waiter: the server writes the chunk straight to the socket. It must not call back into
        # the engine; it may wake the waiter.
        self.sink: Callable[[Stream], None] | None = None

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Wait until the engine has produced more tokens (or finished) since the last look."""
        self.waiter = asyncio.get_running_loop().create_future()
        await self.waiter


class Engine:
    """One card's scheduler. Call :meth:`start` inside a running loop, :meth:`submit` streams, :meth:`close`."""

    def __init__(self, config: EngineConfig):
        self.cfg = config
        self.waiting: deque[Stream] = deque()
        self.buckets: list[set[Stream]] = [set() for _ in range(max(1, config.stream_interval))]
        self.finishing: dict[int, list[Stream]] = {}
        self.running = 0
        self.step_no = 0
        self.kv_reserved = 0
        self._sum_prompt = 0  # of running streams
        self._sum_admit = 0  # of running streams
        # counters (monotonic)
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.steps = 0
        self.busy_s = 0.0  # modelled wall seconds spent in steps
        self.late_s = 0.0  # how far steps slipped behind their deadlines, summed
        self.resyncs = 0  # times the schedule was reset because it fell too far behind
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.e2e = Hist(E2E_BUCKETS)
        self._t_step: float | None = None  # when the last step ended (for the ITL of the next)
        self._admitted = 0  # streams admitted in the current step (their first token is no gap)
        self.power = PowerMeter(config.time_scale)  # the card's energy counter (power.py)
        self._idle = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closed = False
        self._sink_error_reported = False

    # -- public -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")

    async def close(self) -> None:
        self._closed = True
        self._idle.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.drop_all()

    def submit(self, s: Stream) -> None:
        s.state = 1
        self.waiting.append(s)
        self._idle.set()

    def cancel(self, s: Stream) -> None:
        """The client went away: free the stream's slot (tokens already generated stay counted)."""
        if s.state == 1:
            try:
                self.waiting.remove(s)
            except ValueError:
                pass
        elif s.state == 2:
            self._release(s)
        s.state = 3
        s.cancelled = True

    def drop_all(self) -> None:
        """Forget every stream (the card went down); their handlers are woken and see ``cancelled``."""
        for s in list(self.waiting):
            s.state = 3
            s.cancelled = True
            s._wake()
        self.waiting.clear()
        for b in self.buckets:
            for s in b:
                s.state = 3
                s.cancelled = True
                s._wake()
            b.clear()
        self.finishing.clear()
        self.running = 0
        self.kv_reserved = 0
        self._sum_prompt = 0
        self._sum_admit = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_used(self) -> int:
        """KV tokens in use now: prompt plus generated tokens of running streams."""
        return self._sum_prompt + self.running * self.step_no - self._sum_admit

    # -- internals --------------------------------------------------------------------------------------------
    def _release(self, s: Stream) -> None:
        self.buckets[s.admit % len(self.buckets)].discard(s)
        self.running -= 1
        self.kv_reserved -= s.need
        self._sum_prompt -= s.prompt_tokens
        self._sum_admit -= s.admit

    def _admit(self) -> int:
        cfg = self.cfg
        prefill = 0
        admitted = 0
        waiting = self.waiting
        k = self.step_no
        nb = len(self.buckets)
        while waiting and self.running < cfg.max_seqs:
            s = waiting[0]
            if self.running and self.kv_reserved + s.need > cfg.kv_tokens:
                break
            waiting.popleft()
            s.state = 2
            s.admit = k
            self.buckets[k % nb].add(s)
            self.finishing.setdefault(k + s.n - 1, []).append(s)
            self.running += 1
            self.kv_reserved += s.need
            self._sum_prompt += s.prompt_tokens
            self._sum_admit += k
            prefill += s.prompt_tokens
            admitted += 1
        self._admitted = admitted
        if prefill:
            self.prompt_tokens += prefill
        return prefill

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time
        sleep = asyncio.sleep
        cfg = self.cfg
        deadline = clock()
        while not self._closed:
            if not self.running and not self.waiting:
                self._idle.clear()
                await self._idle.wait()
                self.power.advance(0)
                deadline = clock()
                self._t_step = None
                continue
            prefill = self._admit()
            dur = cfg.step_s(self.running, prefill)
            deadline += dur
            now = clock()
            delay = deadline - now
            if delay > 0:
                await sleep(delay)
            else:
                self.late_s -= delay
                await sleep(0)  # let handlers write
                if -delay > max(1.0, 8 * dur):  # hopelessly behind: do not burst to catch up
                    deadline = clock()
                    self.resyncs += 1
            self.busy_s += dur
            self.power.advance(self.running)
            end = clock()
            if self._t_step is not None and self.running > self._admitted:  # each stream's gap since its last token
                self.itl.observe(end - self._t_step, self.running - self._admitted)
            self._t_step = end
            self._complete_step()

    def _call_sink(self, s: Stream, sink: Callable[[Stream], None]) -> None:
        try:
            sink(s)
        except Exception:
            s.sink = None
            s.cancelled = True
            s._wake()
            if not self._sink_error_reported:
                self._sink_error_reported = True
                traceback.print_exc()

    def _complete_step(self) -> None:
        k = self.step_no
        self.steps += 1
        self.generation_tokens += self.running
        now = None
        fin = self.finishing.pop(k, None)
        if fin:  # first the streams that end in this step (they leave the buckets)
            for s in fin:
                if s.state != 2:
                    continue
                self._release(s)
                s.state = 3
                s.count = s.n
                s.done = True
                if now is None:
                    now = time.monotonic()
                if s.t_first is None:
                    s.t_first = now
                    self.ttft.observe(now - s.t_arrival)
                self.e2e.observe(now - s.t_arrival)
                if s.sink is not None:
                    self._call_sink(s, s.sink)
                s._wake()
        for s in self.buckets[k % len(self.buckets)]:
            s.count = k - s.admit + 1
            if s.t_first is None:
                if now is None:
                    now = time.monotonic()
                s.t_first = now
                self.ttft.observe(now - s.t_arrival)
            if s.sink is not None:
                self._call_sink(s, s.sink)
            else:
                w = s.waiter
                if w is not None and not w.done():
                    w.set_result(None)
        self.step_no = k + 1
