"""The engine model of one simulated GPU card: continuous batching with a linear step cost.

One loop per card. A decoding step costs ``(step_ms + per_stream_ms * running) * time_scale`` milliseconds, plus
``prefill_ms_per_token * time_scale`` for every prompt token admitted in that step that the prefix cache did not
hold. Every running stream gets one token per step. At most ``max_seqs`` streams run; fewer when their KV
reservation (prompt tokens plus the tokens the stream will generate) would overflow ``kv_tokens``. The rest wait,
first in first out; nothing is preempted.

With ``prefix_caching`` (the default, as in vLLM v1) the KV budget is a pool of ``kv_tokens // block_size`` blocks
(:mod:`.prefix`): a stream's full prompt blocks are cached and shared (a block several streams hold counts once),
the longest cached chain of a new prompt's blocks costs no prefill (its last token is always computed), and the
blocks of ended streams stay cached until new ones need the room (least recently used first). Without it the
reservation is counted in tokens, as before the cache, and every prompt token is computed.

The hot path is integer arithmetic: streams are bucketed by the step they were admitted in modulo the stream
interval, so a step touches only the streams that emit a chunk in it (``running / stream_interval`` of them) and
the streams that finish in it. Steps are scheduled on absolute deadlines, so the modelled rate holds over time
as long as the process keeps up; when it does not, the slip is recorded in ``late_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .hist import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, Hist
from .power import PowerMeter
from .prefix import BLOCK_SIZE, BlockPool


@dataclass(frozen=True)
class EngineConfig:
    step_ms: float = 12.94
    per_stream_ms: float = 0.2451
    max_seqs: int = 512
    kv_tokens: int = 173_000
    # Prefill of a 27B dense model costs 2 x 27e9 = 54 GFLOP a token; the reference's card (Qwen3.8-27B NVFP4, one
    # GPU) behaves like a ~1.8 TB/s, 96 GB, 600 W Blackwell card (its 12.94 ms step at one stream reads the ~16 GB
    # of weights at ~1.3 TB/s; a B200 would take ~3 ms), whose dense FP4 peak is ~2 PFLOPS: at ~40% of it (FP4
    # GEMMs, BF16 attention and the rest) prefill runs at ~0.77 PFLOPS, 0.07 ms (14k tokens/s) a token. The
    # reference's TTFT agrees: 256 streams of 48 tokens arriving together cost one step of 12.94 + 0.2451 x 256 +
    # 0.07 x 12,288 = 936 ms (measured median 935), 128 streams 474 ms (449); at 1 stream it only bounds the rate
    # (23 ms - a 13.7 ms step leaves 9 ms for 48 tokens and the server's own overhead).
    prefill_ms_per_token: float = 0.07
    stream_interval: int = 4
    time_scale: float = 1.0
    prefix_caching: bool = True  # vLLM v1's automatic prefix caching (--no-prefix-caching turns it off)
    block_size: int = BLOCK_SIZE  # tokens per KV block: the unit of the prefix cache and, with it, of the budget

    def step_s(self, running: int, prefill_tokens: int = 0) -> float:
        """Wall seconds of one step with ``running`` streams and ``prefill_tokens`` prompt tokens to compute."""
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
        "blocks",
        "cancelled",
        "count",
        "done",
        "hit",
        "n",
        "need",
        "own",
        "prompt_tokens",
        "sink",
        "state",
        "t_arrival",
        "t_first",
        "waiter",
    )

    def __init__(self, prompt_tokens: int, n: int, blocks: tuple[bytes, ...] = ()):
        if n < 1:
            raise ValueError("a stream generates at least one token")
        self.prompt_tokens = prompt_tokens
        self.n = n
        self.need = prompt_tokens + n  # KV reservation, in tokens (without the prefix cache)
        self.blocks = blocks  # the hashes of the prompt's full blocks (prefix.prompt_blocks); () if none given
        self.hit = 0  # of them, how many the prefix cache held at admission
        self.own = 0  # blocks reserved for this stream alone: its partial prompt block and its generation
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
        self.kv_reserved = 0  # tokens (without the prefix cache)
        self.pool = self._new_pool()  # KV blocks (with it)
        self._sum_prompt = 0  # of running streams: their prompt tokens outside cached blocks
        self._sum_admit = 0  # of running streams
        # counters (monotonic)
        self.generation_tokens = 0
        self.prompt_tokens = 0  # every prompt token admitted (vllm:prompt_tokens_total) ...
        self.prefix_queries = 0  # ... looked up in the prefix cache (all of them, as before the cache) ...
        self.prefix_hits = 0  # ... found there ...
        self.prefill_computed = 0  # ... and computed (not found): what cost prefill time
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
        self.pool = self._new_pool()  # a server that went down comes back with an empty cache
        self._sum_prompt = 0
        self._sum_admit = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_used(self) -> int:
        """KV tokens in use now: prompt plus generated tokens of running streams (a cached prompt block that
        several share, once; cached blocks no stream holds are free, as vLLM's usage counts them)."""
        shared = self.pool.held * self.cfg.block_size if self.pool is not None else 0
        return shared + self._sum_prompt + self.running * self.step_no - self._sum_admit

    def cache_stats(self) -> dict:
        """The prefix cache's counters, in tokens (``prefill_tokens_computed``: the admitted prompt tokens that cost
        prefill time; the rest were hits), and its blocks now (None without the cache), for ``/sim/stats``."""
        pool = self.pool
        return {
            "prefix_caching": pool is not None, "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits, "prefill_tokens_computed": self.prefill_computed,
            "kv_blocks": pool.capacity if pool else None, "kv_blocks_used": pool.used if pool else None,
            "kv_blocks_cached": len(pool.refs) if pool else None,
            "kv_blocks_evicted": pool.evictions if pool else None,
        }

    # -- internals --------------------------------------------------------------------------------------------
    def _new_pool(self) -> BlockPool | None:
        cfg = self.cfg
        return BlockPool(cfg.kv_tokens // cfg.block_size) if cfg.prefix_caching else None

    def _release(self, s: Stream) -> None:
        self.buckets[s.admit % len(self.buckets)].discard(s)
        self.running -= 1
        if self.pool is not None:
            self.pool.release(s.blocks, s.own)
            self._sum_prompt -= s.prompt_tokens - len(s.blocks) * self.cfg.block_size
        else:
            self.kv_reserved -= s.need
            self._sum_prompt -= s.prompt_tokens
        self._sum_admit -= s.admit

    def _reserve_tokens(self, s: Stream) -> int:
        """Without the prefix cache: reserve the stream's prompt and generation in tokens; returns the prompt
        tokens to compute, or -1 when the stream does not fit beside the running ones."""
        if self.running and self.kv_reserved + s.need > self.cfg.kv_tokens:
            return -1
        self.kv_reserved += s.need
        self._sum_prompt += s.prompt_tokens
        self.prefix_queries += s.prompt_tokens  # looked up and never found, as /metrics reported before the cache
        return s.prompt_tokens

    def _reserve_blocks(self, s: Stream) -> int:
        """With the prefix cache: hold the stream's prompt blocks (the cached leading ones are hits) and its own
        blocks; returns the prompt tokens to compute, or -1 when its new blocks do not fit even after evicting
        every free cached block (the first stream beside none is admitted anyway, as without the cache)."""
        pool, bs, p = self.pool, self.cfg.block_size, s.prompt_tokens
        assert pool is not None
        hit = pool.match(s.blocks, (p - 1) // bs)  # never the whole prompt: its last token is always computed
        own = -(-(p + s.n) // bs) - len(s.blocks)  # ceil: the blocks of prompt and generation, less the cached ones
        if self.running and not pool.fits(s.blocks, hit, own):
            return -1
        pool.acquire(s.blocks, own)
        s.hit, s.own = hit, own
        self._sum_prompt += p - len(s.blocks) * bs
        self.prefix_queries += p
        self.prefix_hits += hit * bs
        return p - hit * bs

    def _admit(self) -> int:
        cfg = self.cfg
        prefill = 0
        admitted = 0
        waiting = self.waiting
        k = self.step_no
        nb = len(self.buckets)
        reserve = self._reserve_tokens if self.pool is None else self._reserve_blocks
        while waiting and self.running < cfg.max_seqs:
            s = waiting[0]
            compute = reserve(s)
            if compute < 0:
                break
            waiting.popleft()
            s.state = 2
            s.admit = k
            self.buckets[k % nb].add(s)
            self.finishing.setdefault(k + s.n - 1, []).append(s)
            self.running += 1
            self._sum_admit += k
            self.prompt_tokens += s.prompt_tokens
            prefill += compute
            admitted += 1
        self._admitted = admitted
        self.prefill_computed += prefill
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
