"""`handbook bench`: a concurrency ladder against servers, read from their own counters.

    handbook bench --backend URL [--backend URL ...] [--streams 1,4,8,16,32,64,128,256] [--window 40]
                   [--max-tokens 512] [--out DIR] [--model NAME] [--api-key K] [--ramp S] [--config FILE.toml]
    handbook bench compare A.json B.json

For each level N, N streaming requests per backend are kept in flight for the whole window (see
:mod:`orchestrator.bench.load` for the method); the figures come from ``vllm:generation_tokens_total`` sampled
every 0.5 s (:mod:`orchestrator.metrics`). Writes ``ladder.json``, ``ladder.csv`` and ``ladder.svg`` into
``--out`` and prints a table like the reference's Table 1; ``compare`` prints a ratio table like its Table 2.

``ladder.json``: ``{"levels": [{"streams", "sustained_tok_s", "best_second_tok_s", "per_stream_tok_s", "step_ms",
"ttft_median_ms", "running", "waiting", ...}], "fit": {"a_ms", "b_ms", "ceiling_tok_s"} | null, ...}``. Per level,
``streams`` is per backend; sustained and best second are summed over the backends; per stream = sustained /
(streams x backends); step_ms = 1000 / per stream (per server); running and waiting are the medians over the
window of the servers' gauges, summed. Extensions: per level ``held`` (false when requests waited: such a level
is flagged and left out of the fit), ``window_s``, ``requests_completed``, ``request_errors``, ``metric`` and, with
several backends, ``per_backend`` (each server's own sustained, best second, running, waiting); at the top
``label``, ``created``, ``backends``, ``model``, ``window_s``, ``ramp_s``, ``max_tokens``, ``interval_s``,
``time_scale``, ``metric``. The fit is least squares over the held levels; ``ceiling_tok_s`` = 1000 / b, per server.

Every figure is in wall-clock seconds. Against the simulator run with ``--time-scale X`` the model's own figures
are tok/s x X and step ms / X; ``ladder.json`` records the servers' ``time_scale`` when they report one.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import os
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
from rich.console import Console

from ..config import normalise_url
from ..errors import BackendError, ConfigError, HandbookError
from ..metrics import MetricsSampler
from ..osutil import prepare_out_dir, raise_open_file_limit
from .load import Target, measure_level, wait_drained
from .report import (
    chart_svg,
    compare_table,
    fit_line,
    fit_step,
    ladder_table,
    stdout_console,
    write_csv,
)

DEFAULT_STREAMS = (1, 4, 8, 16, 32, 64, 128, 256)
CONFIG_KEYS = {"backends", "streams", "window", "max_tokens", "out", "model", "ramp", "interval", "label"}


@dataclass(frozen=True)
class BenchSettings:
    backends: tuple[str, ...]
    streams: tuple[int, ...] = DEFAULT_STREAMS
    window: float = 40.0
    max_tokens: int = 512
    out: str = "handbook-bench"
    model: str | None = None
    api_key: str = field(default="EMPTY", repr=False)
    ramp: float = 1.0
    interval: float = 0.5
    label: str | None = None


# ---------------------------------------------------------------------------------------------- arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Throughput ladder against OpenAI-compatible servers, read from their own counters "
        "(vllm:generation_tokens_total). 'handbook bench compare A.json B.json' compares two ladders."
    )
    parser.add_argument(
        "command",
        nargs="*",
        metavar="compare A.json B.json",
        help="compare two ladder.json files (ratio B / A per stream count)",
    )
    parser.add_argument(
        "--backend",
        action="append",
        metavar="URL",
        help="OpenAI-compatible base URL ending in /v1; repeatable (default: $HANDBOOK_BACKENDS)",
    )
    parser.add_argument("--streams", metavar="LIST", help="streams per backend, e.g. 1,4,8,16,32,64,128,256")
    parser.add_argument("--window", type=float, metavar="S", help="measured seconds per level (default 40)")
    parser.add_argument("--max-tokens", type=int, metavar="T", help="max_tokens per request (default 512)")
    parser.add_argument("--out", metavar="DIR", help="output directory (default ./handbook-bench)")
    parser.add_argument("--model", metavar="NAME", help="default: the first model each backend lists")
    parser.add_argument("--api-key", metavar="KEY", help='default: $OPENAI_API_KEY, else "EMPTY"')
    parser.add_argument(
        "--ramp",
        type=float,
        metavar="S",
        help="seconds excluded at each level's start; the window also waits for every stream's first token "
        "(default 1)",
    )
    parser.add_argument("--interval", type=float, metavar="S", help="/metrics sampling interval (default 0.5)")
    parser.add_argument("--label", metavar="NAME", help="a name for this ladder (used by compare)")
    parser.add_argument("--config", metavar="FILE.toml", help="a bench file (see examples/bench_ladder.toml)")


def _parse_streams(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        items: list[Any] = [x.strip() for x in value.split(",") if x.strip()]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ConfigError(f"streams must be a list like 1,4,16,64, got {value!r}")
    out: list[int] = []
    for x in items:
        try:
            n = int(x) if not isinstance(x, bool) else -1
            if isinstance(x, float) and not x.is_integer():
                n = -1
        except (TypeError, ValueError):
            n = -1
        if n < 1:
            raise ConfigError(f"streams must be whole numbers of at least 1, got {x!r}")
        out.append(n)
    if not out:
        raise ConfigError("streams is empty")
    return tuple(dict.fromkeys(out))


def _load_config(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read bench file {p}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"invalid TOML in {p}: {e}") from None
    unknown = sorted(set(data) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {p}; known keys: {', '.join(sorted(CONFIG_KEYS))}")
    return data


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Merge the bench file (if any), the flags and the environment; every problem is a ConfigError."""
    values: dict[str, Any] = _load_config(args.config) if getattr(args, "config", None) else {}
    for name in ("window", "max_tokens", "out", "model", "ramp", "interval", "label", "streams"):
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    backends: list[str] = []
    if getattr(args, "backend", None):
        for b in args.backend:
            backends += [x.strip() for x in b.split(",") if x.strip()]
    elif values.get("backends"):
        raw = values["backends"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise ConfigError("backends must be a list of URLs")
        backends = list(raw)
    else:
        backends = [x.strip() for x in os.environ.get("HANDBOOK_BACKENDS", "").split(",") if x.strip()]
    if not backends:
        raise ConfigError(
            "no backend: pass --backend URL (an OpenAI-compatible base URL ending in /v1), "
            "set $HANDBOOK_BACKENDS, or start one with 'handbook sim'"
        )
    urls = tuple(dict.fromkeys(normalise_url(b) for b in backends))

    def number(name: str, default: float, *, minimum: float, strict: bool) -> float:
        v = values.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{name} must be a number, got {v!r}")
        if v < minimum or (strict and v == minimum):
            raise ConfigError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {v!r}")
        return float(v)

    max_tokens = values.get("max_tokens", 512)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(f"max_tokens must be a whole number of at least 1, got {max_tokens!r}")
    api_key = getattr(args, "api_key", None) or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    out = values.get("out", "handbook-bench")
    if not isinstance(out, str) or not out.strip():
        raise ConfigError(f"out must be a directory path, got {out!r}")
    model = values.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ConfigError(f"model must be a name, got {model!r}")
    label = values.get("label")
    return BenchSettings(
        backends=urls,
        streams=_parse_streams(values.get("streams", DEFAULT_STREAMS)),
        window=number("window", 40.0, minimum=0, strict=True),
        max_tokens=max_tokens,
        out=out,
        model=model,
        api_key=api_key,
        ramp=number("ramp", 1.0, minimum=0, strict=False),
        interval=number("interval", 0.5, minimum=0, strict=True),
        label=str(label) if label is not None else None,
    )


# ------------------------------------------------------------------------------------------------- running


def run(args: argparse.Namespace) -> int:
    words = list(getattr(args, "command", None) or [])
    if words:
        if words[0] != "compare":
            raise ConfigError(f"unknown bench command {words[0]!r}; did you mean 'handbook bench compare A B'?")
        if len(words) != 3:
            raise ConfigError("usage: handbook bench compare A.json B.json")
        return compare(words[1], words[2])
    settings = settings_from_args(args)
    out = prepare_out_dir(settings.out)
    _raise_open_file_limit(max(settings.streams) * len(settings.backends) + 4 * len(settings.backends) + 64)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    ladder = anyio.run(_run_unwrapped, settings, err, lambda partial: write_outputs(partial, out))
    write_outputs(ladder, out)
    console = stdout_console()
    console.print(ladder_table(ladder))
    console.print(fit_line(ladder["fit"]))
    _print_time_scale_note(ladder, err)
    err.print(f"wrote {out / 'ladder.json'}, {out / 'ladder.csv'}, {out / 'ladder.svg'}")
    return 0


def write_outputs(ladder: dict[str, Any], out: Path) -> None:
    (out / "ladder.json").write_bytes(orjson.dumps(ladder, option=orjson.OPT_INDENT_2) + b"\n")
    write_csv(out / "ladder.csv", ladder["levels"])
    (out / "ladder.svg").write_text(chart_svg(ladder), encoding="utf-8")


def _raise_open_file_limit(needed: int) -> None:
    if raise_open_file_limit(needed) < needed:
        raise ConfigError(
            f"the ladder needs about {needed} open files but the limit cannot be raised that far; "
            "lower --streams or raise the limit (ulimit -Hn)"
        )


def _print_time_scale_note(ladder: dict[str, Any], console: Console) -> None:
    ts = ladder.get("time_scale")
    if isinstance(ts, int | float) and ts != 1:
        console.print(
            f"note: the servers are simulated at time scale {ts:g}; figures are wall-clock. "
            f"In model time: tok/s x {ts:g}, step ms / {ts:g}."
        )


def _first_handbook_error(exc: BaseException) -> BaseException:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = _first_handbook_error(sub)
            if isinstance(found, HandbookError | KeyboardInterrupt):
                return found
    return exc


async def _run_unwrapped(
    settings: BenchSettings, console: Console, on_level: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    try:
        return await run_ladder(settings, console, on_level)
    except BaseExceptionGroup as eg:
        found = _first_handbook_error(eg)
        if found is not eg:
            raise found from None
        raise


async def _get_json(session: aiohttp.ClientSession, url: str, api_key: str) -> Any:
    async with session.get(url, headers={"Authorization": f"Bearer {api_key}"}) as resp:
        if resp.status != 200:
            raise _HTTPStatus(resp.status)
        return orjson.loads(await resp.read())


class _HTTPStatus(Exception):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status


async def discover(settings: BenchSettings) -> tuple[list[Target], Any]:
    """Check every backend answers /v1/models; pick each one's model; read the simulator's time scale."""
    targets: dict[str, Target] = {}
    scales: dict[str, float] = {}
    timeout = aiohttp.ClientTimeout(total=15)

    async def one(session: aiohttp.ClientSession, url: str) -> None:
        try:
            data = await _get_json(session, url + "/models", settings.api_key)
        except _HTTPStatus as e:
            raise BackendError(f"backend {url} answered /models with HTTP {e.status}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise BackendError(f"backend {url} is unreachable: {reason}") from None
        except ValueError:
            raise BackendError(f"backend {url} answered /models with something that is not JSON") from None
        model = settings.model
        if model is None:
            ids = [m.get("id") for m in (data.get("data") or []) if isinstance(m, dict)] if isinstance(
                data, dict
            ) else []
            ids = [i for i in ids if isinstance(i, str) and i]
            if not ids:
                raise BackendError(f"backend {url} lists no model at /models; pass --model NAME")
            model = ids[0]
        targets[url] = Target(url=url, model=model, api_key=settings.api_key)
        try:  # the simulator's time scale, when the server is one
            stats = await _get_json(session, url.removesuffix("/v1") + "/sim/stats", settings.api_key)
            if isinstance(stats, dict) and isinstance(stats.get("time_scale"), int | float):
                scales[url] = float(stats["time_scale"])
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, _HTTPStatus):
            pass

    async with aiohttp.ClientSession(timeout=timeout) as session, anyio.create_task_group() as tg:
        for url in settings.backends:
            tg.start_soon(one, session, url)
    time_scale: Any = None
    if scales:
        vals = sorted(set(scales.values()))
        time_scale = vals[0] if len(vals) == 1 and len(scales) == len(settings.backends) else scales
    return [targets[u] for u in settings.backends], time_scale


async def run_ladder(
    settings: BenchSettings,
    console: Console | None = None,
    on_level: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Measure every level against every backend; return the ladder (``ladder.json``'s content).

    ``on_level`` sees the ladder so far after each level (the command writes its files then, so an interrupted
    bench keeps the levels it finished).
    """
    console = console or Console(stderr=True, highlight=False, soft_wrap=True)
    targets, time_scale = await discover(settings)
    urls = [t.url for t in targets]
    models = sorted({t.model for t in targets})
    sampler = MetricsSampler(urls, interval=settings.interval)
    numbers = itertools.count(1)
    levels: list[dict[str, Any]] = []
    started = time.time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        with anyio.move_on_after(10):
            while sampler.rounds == 0:
                await anyio.sleep(0.02)
        if not any(p[1] is not None for s in sampler.series.values() for p in s):
            console.print(
                "[yellow]warning:[/] no server exposes vllm:generation_tokens_total at /metrics; "
                "figures fall back to client-side estimates"
            )
        if not await wait_drained(sampler, urls, limit=30):
            console.print("[yellow]warning:[/] the servers were busy before the bench started")
        for n in settings.streams:
            console.print(
                f"level {n} stream{'s' if n != 1 else ''} x {len(urls)} server{'s' if len(urls) != 1 else ''}: "
                f"ramp, then {settings.window:g} s window ..."
            )
            level = await measure_level(
                targets=targets,
                streams=n,
                window=settings.window,
                ramp=settings.ramp,
                max_tokens=settings.max_tokens,
                sampler=sampler,
                numbers=numbers,
            )
            levels.append(level)
            if on_level is not None:
                on_level(_ladder(settings, started, urls, models, time_scale, levels))
            console.print(
                f"  sustained {level['sustained_tok_s']:,.1f} tok/s, best second "
                f"{level['best_second_tok_s']:,.1f}, per stream {level['per_stream_tok_s']:,.2f}"
                + ("" if level["held"] else f"  [red]NOT HELD ({level['waiting']:g} waiting)[/]")
            )
            if not await wait_drained(sampler, urls, limit=60):
                console.print("[yellow]warning:[/] the servers did not drain between levels")
        tg.cancel_scope.cancel()
    return _ladder(settings, started, urls, models, time_scale, levels)


def _ladder(
    settings: BenchSettings,
    started: float,
    urls: list[str],
    models: list[str],
    time_scale: Any,
    levels: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "label": settings.label,
        "created": _dt.datetime.fromtimestamp(started, _dt.UTC).isoformat(timespec="seconds"),
        "backends": urls,
        "model": models[0] if len(models) == 1 else models,
        "window_s": settings.window,
        "ramp_s": settings.ramp,
        "max_tokens": settings.max_tokens,
        "interval_s": settings.interval,
        "time_scale": time_scale,
        "metric": "vllm:generation_tokens_total",
        "levels": list(levels),
        "fit": fit_step(levels),
    }


# ------------------------------------------------------------------------------------------------- compare


def load_ladder(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from None
    except orjson.JSONDecodeError:
        raise ConfigError(f"{p} is not JSON (expected a ladder.json written by 'handbook bench')") from None
    levels = data.get("levels") if isinstance(data, dict) else None
    if not isinstance(levels, list) or not all(
        isinstance(lv, dict) and isinstance(lv.get("streams"), int) and "sustained_tok_s" in lv for lv in levels
    ):
        raise ConfigError(f"{p} is not a ladder.json: it needs 'levels' with 'streams' and 'sustained_tok_s'")
    return data


def _label(data: dict[str, Any], path: str, other: str) -> str:
    if data.get("label"):
        return str(data["label"])
    p, q = Path(path), Path(other)
    if p.stem != q.stem:
        return p.stem
    return p.parent.name or p.stem


def compare(path_a: str, path_b: str, console: Console | None = None) -> int:
    """Print B against A (ratio B / A) at every stream count both ladders measured."""
    a, b = load_ladder(path_a), load_ladder(path_b)
    la, lb = _label(a, path_a, path_b), _label(b, path_b, path_a)
    if la == lb:
        la, lb = f"A ({la})", f"B ({lb})"
    if not {lv["streams"] for lv in a["levels"]} & {lv["streams"] for lv in b["levels"]}:
        raise ConfigError(f"{path_a} and {path_b} share no stream count; nothing to compare")
    console = console or stdout_console()
    console.print(compare_table(a, b, la, lb))
    for label, data in ((la, a), (lb, b)):
        fit = data.get("fit")
        if fit and fit.get("b_ms"):
            ceiling = f"{fit['ceiling_tok_s']:,.0f}" if fit.get("ceiling_tok_s") else "-"
            console.print(
                f"{label}: step = {fit['a_ms']:.2f} ms + {fit['b_ms']:.4f} ms x N, ceiling {ceiling} tok/s"
            )
    return 0


def main(argv: list[str] | None = None) -> int:  # python -m orchestrator.bench (the CLI normally dispatches)
    parser = argparse.ArgumentParser(prog="handbook bench")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except HandbookError as e:
        print(f"handbook: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
