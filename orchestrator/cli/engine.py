"""`handbook engine start|stop|status|install`: the embedded local engine from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ConfigError
from ..engine import (
    INSTALL_HINT,
    engine_python,
    engine_status,
    install,
    model_dir,
    model_ok,
    resolve_cache_dir,
    start_background,
    stop_background,
)
from ..engine.children import Progress


def _cli_progress() -> tuple[Progress, Callable[[], None]]:
    """Progress for the terminal: one updating status line on a TTY, a line every 10 s otherwise."""
    if sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status("")
        status.start()

        def say(msg: str) -> None:
            status.update(msg)
            if "ready" in msg or "installed" in msg or msg.startswith(("installing", "removing", "preparing")):
                status.console.log(msg)

        return say, status.stop
    last = [0.0]

    def say_plain(msg: str) -> None:
        now = time.monotonic()
        if not msg.startswith("starting the local engine") or now - last[0] >= 10:
            last[0] = now
            print(f"handbook: {msg}", file=sys.stderr, flush=True)

    return say_plain, lambda: None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status", "install"),
                        help="start: keep one engine running in the background for repeated jobs; stop; status; "
                             "install: set up vLLM CPU and the model in the cache dir (idempotent)")
    parser.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 for start (default: a free one)")
    parser.add_argument("--cache-dir", default=None, help="default: $HANDBOOK_CACHE, else ~/.cache/handbook")
    parser.add_argument("--force", action="store_true", help="install: reinstall even when installed")
    parser.add_argument("--json", action="store_true", help="status: print the state as JSON")


def run(args: argparse.Namespace) -> int:
    cache = resolve_cache_dir(args.cache_dir)
    if args.port is not None and not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535, got {args.port}")
    if args.action == "install":
        return _install(cache, args.force)
    if args.action == "start":
        return _start(cache, args.port)
    if args.action == "stop":
        stopped = stop_background(cache)
        print("stopped the local engine" if stopped else "no local engine was running", file=sys.stderr)
        return 0
    return _status(cache, args.json)


def _install(cache: Path, force: bool) -> int:
    say, done = _cli_progress()
    try:
        py = install(cache, on_progress=say, force=force)
    finally:
        done()
    print(f"local engine installed: {py}; model: {model_dir(cache)}")
    return 0


def _start(cache: Path, port: int | None) -> int:
    say, done = _cli_progress()
    try:
        state = start_background(cache, port, on_progress=say)
    finally:
        done()
    print(state.url)
    print(f"handbook: local engine running (pid {state.pid}); jobs given no backend use it; "
          "`handbook engine stop` stops it", file=sys.stderr)
    return 0


def _status(cache: Path, as_json: bool) -> int:
    state, healthy = engine_status(cache)
    if as_json:
        print(json.dumps({"running": state is not None, "healthy": healthy,
                          "installed": engine_python(cache) is not None, "model_ready": model_ok(model_dir(cache)),
                          **(state.as_dict() if state else {})}))
    elif state is None:
        installed = engine_python(cache) is not None
        print("not running" + ("" if installed else f" (not installed; {INSTALL_HINT})"))
    else:
        up = time.time() - state.started_at
        print(f"{'running' if healthy else 'starting (not healthy yet)'}: {state.url} "
              f"(pid {state.pid}, model {state.model}, up {up / 60:.0f} min, log {state.log})")
    return 0 if state is not None and healthy else 1
