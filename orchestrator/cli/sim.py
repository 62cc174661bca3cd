"""`handbook sim`: start N simulated GPU cards (vLLM-like OpenAI servers) on 127.0.0.1:P..P+N-1.

Cards can be spread over several processes (``--procs``) so that a small machine keeps up with thousands of
concurrent streams. Prints one line per card with its URL, then a ready line; stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time

from ..core.errors import ConfigError
from ..core.osutil import raise_open_file_limit
from ..sim.engine import EngineConfig
from ..sim.server import Card, SimConfig

HOST = "127.0.0.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    g = parser.add_argument_group("cards")
    g.add_argument("--cards", type=int, default=1, help="number of simulated cards (default 1)")
    g.add_argument("--port", type=int, default=8000, help="first port; cards listen on P..P+N-1 (default 8000)")
    g.add_argument("--model", default="sim-qwen3", help="model id served (default sim-qwen3)")
    g.add_argument("--procs", type=int, default=None,
                   help="spread the cards over K processes (default: min(cards, CPU cores))")
    g.add_argument("--seed", type=int, default=None,
                   help="vary every answer (answers are deterministic per request and seed)")
    g.add_argument("--no-json-schema", action="store_true",
                   help="reject response_format json_schema with HTTP 400 (clients must fall back to text)")
    g.add_argument("--max-model-len", type=int, default=32768, help="context length (default 32768)")
    e = parser.add_argument_group("engine model")
    e.add_argument("--step-ms", type=float, default=d.step_ms, help=f"fixed cost of a step (default {d.step_ms})")
    e.add_argument("--per-stream-ms", type=float, default=d.per_stream_ms,
                   help=f"step cost per running stream (default {d.per_stream_ms})")
    e.add_argument("--max-seqs", type=int, default=d.max_seqs, help=f"most running streams (default {d.max_seqs})")
    e.add_argument("--kv-tokens", type=int, default=d.kv_tokens,
                   help=f"KV cache size in tokens (default {d.kv_tokens}: ~309 streams of ~560 tokens)")
    e.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token,
                   help=f"prefill cost per computed prompt token (default {d.prefill_ms_per_token}: a 27B model "
                        "on the reference's card)")
    e.add_argument("--no-prefix-caching", action="store_true",
                   help="no prefix cache (vLLM's --no-enable-prefix-caching): every prompt token is computed and "
                        "the KV reservation is counted in tokens")
    e.add_argument("--block-size", type=int, default=d.block_size,
                   help=f"tokens per KV block, the prefix cache's unit (default {d.block_size})")
    e.add_argument("--stream-interval", type=int, default=d.stream_interval,
                   help=f"tokens per streamed chunk (default {d.stream_interval})")
    e.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every modelled duration (default 1.0; >1 lets a small machine keep up: "
                        "model seconds = wall seconds / time-scale). Fault times are wall seconds.")
    f = parser.add_argument_group("faults")
    f.add_argument("--fail-rate", type=float, default=0.0, help="share of requests answered HTTP 500")
    f.add_argument("--rate-limit-rate", type=float, default=0.0,
                   help="share of requests answered 429 with Retry-After")
    f.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds on 429 (default 1)")
    f.add_argument("--empty-rate", type=float, default=0.0, help="share of requests answered 200 with no content")
    f.add_argument("--drop-rate", type=float, default=0.0, help="share of requests whose connection is cut "
                   "mid-stream")
    f.add_argument("--hang-rate", type=float, default=0.0, help="share of requests never answered")
    f.add_argument("--down-after", type=float, default=None, metavar="S",
                   help="stop serving after S wall seconds (close the listener, drop every connection)")
    f.add_argument("--down-for", type=float, default=None, metavar="S",
                   help="with --down-after: listen again after S wall seconds down (default: stay down)")
    f.add_argument("--down-cards", default=None, metavar="LIST",
                   help="comma-separated card indexes --down-after applies to (default: all)")
    f.add_argument("--fault-seed", type=int, default=None, help="seed of the fault draws (default: random)")


def _rate(name: str, v: float) -> float:
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"--{name} must be between 0 and 1, got {v}")
    return v


def build_config(args: argparse.Namespace) -> tuple[SimConfig, int, int, int]:
    """Validate the flags; returns (config, cards, first port, processes). Raises ConfigError."""
    cards = args.cards
    _check_sizes(args, cards)
    _check_faults(args)
    down_cards = _down_cards(args.down_cards, cards)
    procs = args.procs if args.procs is not None else min(cards, os.cpu_count() or 1)
    if procs < 1:
        raise ConfigError(f"--procs must be a positive integer, got {procs}")
    procs = min(procs, cards)
    if not args.model or any(c.isspace() for c in args.model):
        raise ConfigError(f"--model must be a non-empty name without spaces, got {args.model!r}")
    eng = EngineConfig(step_ms=args.step_ms, per_stream_ms=args.per_stream_ms, max_seqs=args.max_seqs,
                       kv_tokens=args.kv_tokens, prefill_ms_per_token=args.prefill_ms_per_token,
                       stream_interval=args.stream_interval, time_scale=args.time_scale,
                       prefix_caching=not args.no_prefix_caching, block_size=args.block_size)
    cfg = SimConfig(model=args.model, engine=eng, json_schema=not args.no_json_schema,
                    max_model_len=args.max_model_len, fail_rate=args.fail_rate,
                    rate_limit_rate=args.rate_limit_rate, empty_rate=args.empty_rate, drop_rate=args.drop_rate,
                    hang_rate=args.hang_rate, retry_after=args.retry_after, down_after=args.down_after,
                    down_for=args.down_for, down_cards=down_cards, fault_seed=args.fault_seed, seed=args.seed)
    return cfg, cards, args.port, procs


def _check_sizes(args: argparse.Namespace, cards: int) -> None:
    """The cards, their ports and the engine model's numbers."""
    if cards < 1 or cards > 256:
        raise ConfigError(f"--cards must be between 1 and 256, got {cards}")
    if not 1 <= args.port <= 65535 - cards + 1:
        raise ConfigError(f"--port must leave room for {cards} ports below 65536, got {args.port}")
    positive = {"step-ms": args.step_ms, "per-stream-ms": args.per_stream_ms, "time-scale": args.time_scale,
                "prefill-ms-per-token": args.prefill_ms_per_token}
    for name, v in positive.items():
        if not 0 <= v < float("inf"):  # also rejects NaN
            raise ConfigError(f"--{name} must be a non-negative number, got {v}")
    if args.time_scale <= 0:
        raise ConfigError(f"--time-scale must be positive, got {args.time_scale}")
    for name, v in {"max-seqs": args.max_seqs, "kv-tokens": args.kv_tokens, "block-size": args.block_size,
                    "stream-interval": args.stream_interval, "max-model-len": args.max_model_len}.items():
        if v < 1:
            raise ConfigError(f"--{name} must be a positive integer, got {v}")
    if not args.no_prefix_caching and args.kv_tokens < args.block_size:
        raise ConfigError(f"--kv-tokens ({args.kv_tokens}) must hold at least one block of --block-size "
                          f"({args.block_size}) tokens")


def _check_faults(args: argparse.Namespace) -> None:
    """The fault rates (each a share, together at most 1), Retry-After and the down timer."""
    rates = [_rate("fail-rate", args.fail_rate), _rate("rate-limit-rate", args.rate_limit_rate),
             _rate("empty-rate", args.empty_rate), _rate("drop-rate", args.drop_rate),
             _rate("hang-rate", args.hang_rate)]
    if sum(rates) > 1.0 + 1e-9:
        raise ConfigError(f"the fault rates add up to {sum(rates):g}, more than 1")
    if args.retry_after < 0:
        raise ConfigError(f"--retry-after must be non-negative, got {args.retry_after}")
    if args.down_after is not None and args.down_after < 0:
        raise ConfigError(f"--down-after must be non-negative, got {args.down_after}")
    if args.down_for is not None:
        if args.down_for < 0:
            raise ConfigError(f"--down-for must be non-negative, got {args.down_for}")
        if args.down_after is None:
            raise ConfigError("--down-for needs --down-after")


def _down_cards(value: str | None, cards: int) -> tuple[int, ...] | None:
    """--down-cards as card indexes (None: every card)."""
    if value is None:
        return None
    try:
        down_cards = tuple(sorted({int(x) for x in str(value).split(",") if x.strip()}))
    except ValueError:
        raise ConfigError(f"--down-cards must be comma-separated card indexes, got {value!r}") from None
    bad = [i for i in down_cards if not 0 <= i < cards]
    if bad:
        raise ConfigError(f"--down-cards names cards {bad} but there are only cards 0..{cards - 1}")
    return down_cards


async def _serve(cfg: SimConfig, indexes: list[int], first_port: int, ready, stop_fd: int | None = None) -> None:
    """Run some cards until SIGINT/SIGTERM (or until ``stop_fd`` reaches EOF: the parent went away)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if stop_fd is not None:
        def _on_parent():
            try:
                data = os.read(stop_fd, 1)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(stop_fd)
                stop.set()
        loop.add_reader(stop_fd, _on_parent)
    cards = [Card(i, first_port + i, cfg, HOST) for i in indexes]
    started: list[Card] = []
    try:
        for c in cards:
            try:
                await c.start()
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise ConfigError(f"port {c.port} on {HOST} is already in use") from None
                raise ConfigError(f"cannot listen on {HOST}:{c.port}: {e.strerror or e}") from None
            started.append(c)
        ready([(c.index, c.url) for c in cards])
        await stop.wait()
    finally:
        for c in started:
            await c.stop()


def _print_ready(cards: list[tuple[int, str]], cfg: SimConfig, procs: int) -> None:
    for i, url in sorted(cards):
        power = url.removesuffix("/v1") + f"/dcgm/metrics#gpu={i}"
        print(f"sim card {i}: {url}  power: {power}", flush=True)
    print(f"sim ready: {len(cards)} card(s), model {cfg.model}, time-scale {cfg.engine.time_scale:g}, "
          f"{procs} process(es), pid {os.getpid()}", flush=True)


def _worker(conn, stop_r: int, cfg: SimConfig, indexes: list[int], first_port: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        asyncio.run(_serve(cfg, indexes, first_port, lambda cards: conn.send(("ready", cards)), stop_r))
    except ConfigError as e:
        conn.send(("error", str(e)))
        os._exit(2)
    except BaseException as e:
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(e).__name__}: {e}"))
        os._exit(1)
    os._exit(0)


def run(args: argparse.Namespace) -> int:
    cfg, cards, port, procs = build_config(args)
    raise_open_file_limit(65536)  # each card holds a socket per stream
    if procs == 1:
        try:
            asyncio.run(_serve(cfg, list(range(cards)), port, lambda c: _print_ready(c, cfg, 1)))
        except KeyboardInterrupt:
            pass
        print("sim stopped", flush=True)
        return 0
    return _run_multi(cfg, cards, port, procs)


def _run_multi(cfg: SimConfig, cards: int, port: int, procs: int) -> int:
    workers, conns, stop_w = _start_processes(cfg, cards, port, procs)
    stopping = {"flag": False}

    def _on_signal(signum, frame):
        stopping["flag"] = True

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        ready = _await_ready(dict(zip(conns, workers)), stopping)
        if stopping["flag"]:
            return 0
        _print_ready(ready, cfg, procs)
        return _watch(workers, stopping)
    finally:
        _stop_processes(workers)
        os.close(stop_w)
        for s, h in old.items():
            signal.signal(s, h)
        print("sim stopped", flush=True)


def _start_processes(cfg: SimConfig, cards: int, port: int, procs: int) -> tuple[list, list, int]:
    """Fork one process per group of cards; returns them, the connections they report on, and the write end of
    the pipe whose EOF tells them the parent went away."""
    ctx = multiprocessing.get_context("fork")
    groups = [list(range(cards))[k::procs] for k in range(procs)]
    stop_r, stop_w = os.pipe()  # the parent holds the write end; children see EOF when it goes away
    workers = []
    conns = []
    for g in groups:
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(child_conn, stop_r, cfg, g, port), daemon=False)
        p.start()
        child_conn.close()
        workers.append(p)
        conns.append(parent_conn)
    os.close(stop_r)
    return workers, conns, stop_w


def _await_ready(pending: dict, stopping: dict[str, bool]) -> list[tuple[int, str]]:
    """Every process's cards (index, URL), once all have started (or a signal came). Raises ConfigError."""
    ready: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while pending and not stopping["flag"]:
        if time.monotonic() > deadline:
            raise ConfigError("simulated cards did not start within 60 s")
        answered = multiprocessing.connection.wait(list(pending), timeout=0.2)
        for conn in [c for c in pending if c in answered]:
            try:
                kind, payload = conn.recv()
            except EOFError:
                raise ConfigError("a simulator process exited during start") from None
            if kind == "error":
                raise ConfigError(payload)
            ready.extend(payload)
            del pending[conn]
    return ready


def _watch(workers: list, stopping: dict[str, bool]) -> int:
    """Wait for a signal (0), or for a process to exit on its own (1)."""
    sentinels = [p.sentinel for p in workers]
    while not stopping["flag"]:
        done = multiprocessing.connection.wait(sentinels, timeout=0.5)
        if done:
            time.sleep(0.2)  # a signal to the whole process group reaches the children first
            if stopping["flag"]:
                break
            dead = [p for p in workers if not p.is_alive()]
            print(f"sim: error: simulator process {dead[0].pid} exited with code {dead[0].exitcode}",
                  file=sys.stderr, flush=True)
            return 1
    return 0


def _stop_processes(workers: list) -> None:
    for p in workers:
        if p.is_alive():
            p.terminate()
    t_end = time.monotonic() + 5
    for p in workers:
        p.join(max(0.0, t_end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)
