"""The local engine's lifecycle (orchestrator/engine/) against a stand-in server, fast and without vLLM.

A fake "engine Python" runs a tiny HTTP server whenever it is asked for ``-m vllm.entrypoints...`` and the real
Python otherwise, so every line of the start/stop/reuse/convert logic runs as in production: the launcher that
ties the server to us, the process group, /health polling, the state file, SIGTERM then SIGKILL.
The real engine is exercised by tests/engine/test_real_engine.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

from orchestrator import engine as E
from orchestrator.cli import engine as engine_cli
from orchestrator.core.errors import BackendError, ConfigError
from orchestrator.engine import children, installer, server

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, json, os, signal, subprocess, sys, threading, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("RuntimeError: boom: the fake engine refuses to start", flush=True)
        sys.exit(7)
    # a child in our process group that outlives us briefly, as vLLM's engine core does
    parent = os.getpid()
    subprocess.Popen([sys.executable, "-c",
        f"import os, time\\nwhile os.getppid() == {parent}: time.sleep(0.05)\\ntime.sleep(0.3)"])
    ready_at = time.monotonic() + float(os.environ.get("FAKE_DELAY", "0.5"))

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            if self.path == "/health" and time.monotonic() >= ready_at:
                self.send_response(200); self.end_headers()
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": "smollm2-135m-instruct"}]}).encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
            else:
                self.send_response(503); self.end_headers()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    def term(*_):
        if mode == "ignore_term":
            return
        time.sleep(float(os.environ.get("FAKE_STOP_DELAY", "0.2")))
        os._exit(0)
    signal.signal(signal.SIGTERM, term)
    print("fake engine serving", port, flush=True)
    srv.serve_forever()
    """
)

FAKE_CONVERT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    dest = Path(sys.argv[1])
    counter = Path(os.environ["FAKE_CONVERT_COUNT"])
    counter.write_text(str(int(counter.read_text() or 0) + 1) if counter.exists() else "1")
    if os.environ.get("FAKE_CONVERT_FAIL"):
        dest.mkdir(parents=True); (dest / "config.json").write_text("{}")
        print("ValueError: conversion failed on purpose", flush=True); sys.exit(3)
    dest.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        (dest / name).write_text("{}")
    (dest / "handbook-model.json").write_text(json.dumps({"sanity_answer": "Paris"}))
    """
)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A cache dir and a fake engine Python; returns the cache dir."""
    server = tmp_path / "fake_server.py"
    server.write_text(FAKE_SERVER)
    convert = tmp_path / "fake_convert.py"
    convert.write_text(FAKE_CONVERT)
    py = tmp_path / "fakepython"
    py.write_text(
        f'#!/bin/sh\nif [ "$1" = "-m" ]; then exec "{sys.executable}" "{server}" "$@"; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    py.chmod(0o755)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HANDBOOK_ENGINE_PYTHON", str(py))
    monkeypatch.setenv("FAKE_CONVERT_COUNT", str(tmp_path / "convert-count"))
    monkeypatch.setattr(installer, "CONVERT_SCRIPT", convert)
    monkeypatch.delenv("HANDBOOK_CACHE", raising=False)
    return cache


def group_gone(pgid: int) -> bool:
    return not children.group_alive(pgid) and not children.pid_alive(pgid)


def wait_until(cond, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("HANDBOOK_CACHE", raising=False)
    assert E.resolve_cache_dir() == Path.home() / ".cache" / "handbook"
    monkeypatch.setenv("HANDBOOK_CACHE", str(tmp_path / "c"))
    assert E.resolve_cache_dir() == tmp_path / "c"
    assert E.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_not_installed_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.delenv("HANDBOOK_ENGINE_PYTHON", raising=False)
    monkeypatch.setattr(installer, "_current_env_has_engine", lambda: False)
    assert E.engine_python(tmp_path) is None
    with pytest.raises(BackendError) as info, E.LocalEngine(cache_dir=tmp_path, reuse=False):
        pass
    msg = str(info.value)
    assert "not installed" in msg and "handbook engine install" in msg and "\n" not in msg
    assert info.value.exit_code == 3
    with pytest.raises(BackendError):
        E.prepare_model(tmp_path)


def test_prepare_model_once_atomic_and_idempotent(fake):
    stale = fake / "models" / f".{E.MODEL_NAME}.tmp-99999"
    stale.mkdir(parents=True)
    folder = E.prepare_model(fake)
    assert folder == fake / "models" / E.MODEL_NAME
    assert json.loads((folder / "handbook-model.json").read_text())["format"] == E.MODEL_FORMAT
    assert not stale.exists(), "a folder left by an interrupted conversion is cleaned up"
    assert E.prepare_model(fake) == folder
    assert (Path(os.environ["FAKE_CONVERT_COUNT"])).read_text() == "1", "converted once"
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".") and "tmp" in p.name] == []


def test_failed_conversion_leaves_nothing_half_written(fake, monkeypatch):
    monkeypatch.setenv("FAKE_CONVERT_FAIL", "1")
    with pytest.raises(BackendError) as info:
        E.prepare_model(fake)
    assert "conversion failed on purpose" in str(info.value)
    models = fake / "models"
    assert not (models / E.MODEL_NAME).exists()
    assert [p for p in models.iterdir() if "tmp" in p.name] == []


def test_sync_lifecycle_progress_and_clean_stop(fake):
    said: list[str] = []
    with E.LocalEngine(cache_dir=fake, on_progress=said.append, reuse=False) as eng:
        assert eng.url.startswith("http://127.0.0.1:") and eng.url.endswith("/v1")
        assert eng.model == E.MODEL_NAME
        assert server.health(eng.url.removesuffix("/v1"))
        pid = eng._proc.pid
        assert os.getpgid(pid) == pid, "the server leads a process group of its own"
        assert (fake / "run" / str(eng.port) / "tmp").is_dir()
    assert group_gone(pid), "the server and its children are gone after exit"
    assert eng.stop_s is not None and eng.stop_s < 5
    assert not (fake / "run" / str(eng.port)).exists()
    assert any("starting the local engine" in m for m in said)
    assert any("ready" in m for m in said)


def test_error_inside_the_block_stops_the_server(fake):
    with pytest.raises(RuntimeError), E.LocalEngine(cache_dir=fake, reuse=False) as eng:
        pid = eng._proc.pid
        raise RuntimeError("job failed")
    assert group_gone(pid)


def test_startup_crash_is_a_one_line_error_with_the_cause(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    with pytest.raises(BackendError) as info, E.LocalEngine(cache_dir=fake, reuse=False):
        pass
    msg = str(info.value)
    assert "exited during start-up (exit 7)" in msg and "boom" in msg and "engine-" in msg and "\n" not in msg


def test_a_server_ignoring_sigterm_is_killed_after_the_timeout(fake, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "ignore_term")
    t0 = time.monotonic()
    with E.LocalEngine(cache_dir=fake, reuse=False, stop_timeout=1.0) as eng:
        pid = eng._proc.pid
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 8
    assert group_gone(pid)


def test_port_in_use_is_a_config_error(fake):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match="already in use"), E.LocalEngine(cache_dir=fake, port=port, reuse=False):
            pass


@pytest.mark.anyio
async def test_async_lifecycle_and_cancel_during_startup(fake, monkeypatch):
    async with E.LocalEngine(cache_dir=fake, reuse=False) as eng:
        pid = eng._proc.pid
        assert server.health(eng.url.removesuffix("/v1"))
    assert group_gone(pid)

    monkeypatch.setenv("FAKE_DELAY", "60")  # never healthy in time: cancelled while waiting
    holder: dict[str, E.LocalEngine] = {}

    async def enter() -> None:
        holder["e"] = eng2 = E.LocalEngine(cache_dir=fake, reuse=False)
        async with eng2:
            pass

    with anyio.move_on_after(2.0) as scope:
        await enter()
    assert scope.cancelled_caught, "start-up finished before the cancel: nothing was cancelled"
    proc = holder["e"]._proc
    assert proc is None, "cancelled start-up stopped the server"
    assert holder["e"].url is None


def test_killed_parent_leaves_no_server(fake, tmp_path):
    """SIGKILL of the process that holds a LocalEngine: the kernel's parent-death signal stops the server."""
    E.prepare_model(fake)  # the child process does not see our fake converter
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from orchestrator.engine import LocalEngine
        with LocalEngine(cache_dir={str(fake)!r}, reuse=False) as eng:
            print(eng._proc.pid, flush=True)
            time.sleep(60)
    """))
    env = dict(os.environ, PYTHONPATH=str(Path(E.__file__).parents[2]))  # the same orchestrator as this test
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pid = int(holder.stdout.readline())
        assert children.pid_alive(pid)
        holder.kill()
        holder.wait()
        assert wait_until(lambda: group_gone(pid), timeout=10), "the server outlived its killed parent"
    finally:
        if holder.poll() is None:
            holder.kill()


def _cli(cache: Path, action: str, port: int | None = None, as_json: bool = False) -> int:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    argv = [action, "--cache-dir", str(cache)]
    if port is not None:
        argv += ["--port", str(port)]
    if as_json:
        argv.append("--json")
    return engine_cli.run(parser.parse_args(argv))


def test_background_start_status_reuse_stop(fake, capsys):
    assert E.running_engine_url(fake) is None
    assert _cli(fake, "status") == 1
    assert _cli(fake, "start") == 0
    url = capsys.readouterr().out.strip().splitlines()[-1]
    state = json.loads((fake / "engine" / "state.json").read_text())
    try:
        assert url.endswith("/v1")
        assert state["url"] == url and state["model"] == E.MODEL_NAME
        assert E.running_engine_url(fake) == url
        assert _cli(fake, "start") == 0, "a second start returns the running engine"
        assert capsys.readouterr().out.strip().splitlines()[-1] == url
        assert _cli(fake, "status", as_json=True) == 0
        assert json.loads(capsys.readouterr().out)["healthy"] is True
        with E.LocalEngine(cache_dir=fake) as eng:  # reuse: the job uses the background engine
            assert eng.url == url and eng.reused
        assert E.running_engine_url(fake) == url, "leaving the block does not stop a reused engine"
    finally:
        stopped = _cli(fake, "stop")
        gone = group_gone(state["pid"])  # `stop` returns once the server and its children are gone
        if not gone:  # clean up for the next test; the assertion below still fails
            E.stop_process(state["pid"], timeout=2)
    assert stopped == 0 and gone, "`handbook engine stop` returned with the server's process group alive"
    assert E.running_engine_url(fake) is None
    assert not (fake / "engine" / "state.json").exists()
    assert _cli(fake, "status") == 1


def test_stale_state_file_is_ignored_and_removed(fake):
    (fake / "engine").mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (fake / "engine" / "state.json").write_text(json.dumps(
        {"pid": dead.pid, "port": 9, "url": "http://127.0.0.1:9/v1", "model": "x", "started_at": 0, "log": ""}))
    assert E.running_engine_url(fake) is None
    assert not (fake / "engine" / "state.json").exists()


def test_install_is_a_fast_noop_when_installed(tmp_path, monkeypatch):
    monkeypatch.delenv("HANDBOOK_ENGINE_PYTHON", raising=False)
    venv = tmp_path / "engine" / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (tmp_path / "engine" / "venv" / "handbook-engine.json").write_text(json.dumps({"specs": installer._install_specs()}))
    t0 = time.monotonic()
    assert E.install(tmp_path, prepare=False) == tmp_path / "engine" / "venv" / "bin" / "python"
    assert time.monotonic() - t0 < 1
    assert E.engine_python(tmp_path) == tmp_path / "engine" / "venv" / "bin" / "python"


def test_sigterm_constant_is_what_the_launcher_sends():
    assert "prctl(1, int(signal.SIGTERM)" in children.LAUNCHER  # 1: PR_SET_PDEATHSIG


def test_run_dirs_of_dead_servers_are_swept(fake):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = fake / "run" / "1234"
    (stale / "tmp").mkdir(parents=True)
    (stale / "pid").write_text(str(dead.pid))
    with E.LocalEngine(cache_dir=fake, reuse=False) as eng:
        assert (fake / "run" / str(eng.port) / "pid").read_text() == str(eng._proc.pid)
        assert not stale.exists()
