"""`handbook bench`: a concurrency ladder against servers, read from their own counters.

    handbook bench --backend URL [--power URL[#gpu=LABEL]] [--backend URL ...] [--streams 1,4,8,16,32,64,128,256]
                   [--window 40] [--max-tokens 512] [--out DIR] [--model NAME] [--api-key K] [--ramp S]
                   [--config FILE.toml]
    handbook bench compare A.json B.json

Writes ``ladder.json``, ``ladder.csv`` and ``ladder.svg`` into ``--out`` (after every level, so an interrupted bench
keeps the levels it finished) and prints a table like the reference's Table 1; ``compare`` prints a ratio table
like its Table 2. The method and the keys of ``ladder.json``: :mod:`orchestrator.bench.ladder`.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path
from typing import Any

import anyio
from rich.console import Console

from ..bench import (
    DEFAULT_STREAMS,
    BenchSettings,
    compare,
    fit_line,
    ladder_table,
    run_ladder,
    stdout_console,
    write_outputs,
)
from ..core.config import Backend, normalise_url
from ..core.errors import ConfigError
from ..core.osutil import prepare_out_dir, raise_open_file_limit

CONFIG_KEYS = {"backends", "streams", "window", "max_tokens", "out", "model", "ramp", "interval", "label"}


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
    parser.add_argument(
        "--power",
        action="append",
        metavar="URL[#gpu=LABEL]",
        help="the GPU power page (dcgm-exporter, e.g. http://gpu1:9400/metrics#gpu=0) of each --backend, in order; "
        "repeatable, one per --backend; gives power_w and tokens_per_joule per level",
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
    needed = max(settings.streams) * len(settings.backends) + 4 * len(settings.backends) + 64
    if raise_open_file_limit(needed) < needed:
        raise ConfigError(
            f"the ladder needs about {needed} open files but the limit cannot be raised that far; "
            "lower --streams or raise the limit (ulimit -Hn)"
        )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    ladder = anyio.run(run_ladder, settings, err, lambda partial: write_outputs(partial, out))
    write_outputs(ladder, out)
    console = stdout_console()
    console.print(ladder_table(ladder))
    console.print(fit_line(ladder["fit"]))
    ts = ladder.get("time_scale")
    if isinstance(ts, int | float) and ts != 1:
        err.print(
            f"note: the servers are simulated at time scale {ts:g}; figures are wall-clock. "
            f"In model time: tok/s x {ts:g}, step ms / {ts:g}, power W x {ts:g} (tokens per joule unchanged)."
        )
    err.print(f"wrote {out / 'ladder.json'}, {out / 'ladder.csv'}, {out / 'ladder.svg'}")
    return 0


# ------------------------------------------------------------------------------------------- settings


def settings_from_args(args: argparse.Namespace) -> BenchSettings:
    """Merge the bench file (if any), the flags and the environment; every problem is a ConfigError."""
    values: dict[str, Any] = _load_config(args.config) if getattr(args, "config", None) else {}
    for name in ("window", "max_tokens", "out", "model", "ramp", "interval", "label", "streams"):
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    urls, power = _backends(getattr(args, "backend", None), values, getattr(args, "power", None))
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
        window=_number(values, "window", 40.0, minimum=0, strict=True),
        max_tokens=max_tokens,
        out=out,
        model=model,
        api_key=api_key,
        ramp=_number(values, "ramp", 1.0, minimum=0, strict=False),
        interval=_number(values, "interval", 0.5, minimum=0, strict=True),
        label=str(label) if label is not None else None,
        power=power,
    )


def _backends(
    flags: list[str] | None, values: dict[str, Any], power_flags: list[str] | None = None
) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    """The servers and their power pages: the --backend flags (each may list several) paired in order with the
    --power flags, else the bench file's (URLs, or tables {url, power}), else $HANDBOOK_BACKENDS; normalised, each
    once."""
    backends: list[str] = []
    power: list[str | None] = []
    if flags:
        for b in flags:
            backends += [x.strip() for x in b.split(",") if x.strip()]
    elif values.get("backends"):
        backends, power = _file_backends(values["backends"])
    else:
        backends = [x.strip() for x in os.environ.get("HANDBOOK_BACKENDS", "").split(",") if x.strip()]
    if not backends:
        raise ConfigError(
            "no backend: pass --backend URL (an OpenAI-compatible base URL ending in /v1), "
            "set $HANDBOOK_BACKENDS, or start one with 'handbook sim'"
        )
    if power_flags:
        if len(power_flags) != len(backends):
            raise ConfigError(f"--power given {len(power_flags)} time(s) for {len(backends)} backend(s): give one "
                              "--power per --backend, in the same order")
        power = list(power_flags)
    pairs: dict[str, str | None] = {}
    for i, b in enumerate(backends):
        spec = power[i] if i < len(power) else None
        pairs.setdefault(normalise_url(b), Backend(b, power=spec).power if spec else None)
    return tuple(pairs), tuple(pairs.values())


def _file_backends(raw: Any) -> tuple[list[str], list[str | None]]:
    """A bench file's ``backends``: a URL, a list of URLs, or a list of tables ``{url = ..., power = ...}``."""
    items = [raw] if isinstance(raw, str | dict) else raw
    if not isinstance(items, list):
        raise ConfigError("backends must be a list of URLs (or of tables {url, power})")
    urls: list[str] = []
    power: list[str | None] = []
    for x in items:
        if isinstance(x, str):
            urls.append(x)
            power.append(None)
        elif isinstance(x, dict) and isinstance(x.get("url"), str) and set(x) <= {"url", "power"}:
            if x.get("power") is not None and not isinstance(x["power"], str):
                raise ConfigError(f"backend {x['url']!r}: power must be a URL[#gpu=LABEL], got {x['power']!r}")
            urls.append(x["url"])
            power.append(x.get("power"))
        else:
            raise ConfigError(f"a bench backend is a URL or a table {{url, power}}; got {x!r}")
    return urls, power


def _number(values: dict[str, Any], name: str, default: float, *, minimum: float, strict: bool) -> float:
    v = values.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{name} must be a number, got {v!r}")
    if v < minimum or (strict and v == minimum):
        raise ConfigError(f"{name} must be {'>' if strict else '>='} {minimum:g}, got {v!r}")
    return float(v)


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
