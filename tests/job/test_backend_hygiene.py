"""Backends handled safely: the same server named twice is one backend with one cap, credentials in a URL are
sent but never written, and a tripped backend rejoins only after a probe completion succeeds (a slow one is alive,
not down). Jobs run as the real CLI against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess

import anyio
from local_http import env, job_cmd
from scripted_book import SHAPE, book_answer
from scripted_openai import Answer, Request, ScriptedServer

# -- safety and hygiene -----------------------------------------------------------------------------------------


def test_the_same_server_twice_is_one_backend_with_one_cap(tmp_path):
    out = tmp_path / "o"

    with ScriptedServer(book_answer) as srv:
        urls = [srv.url, f"http://localhost:{srv.port}/v1", srv.url + "/"]
        run = subprocess.run(job_cmd("A test book", urls, out, *SHAPE, "--cap", "3"), capture_output=True,
                             text=True, timeout=120, env=env())
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("is the same server as") == 2
    stats = json.loads((out / "stats.json").read_text())
    assert stats["cards"] == 1 and [b["cap"] for b in stats["per_backend"]] == [3]
    assert stats["per_backend"][0]["max_in_flight"] <= 3



def test_credentials_in_a_backend_url_are_sent_but_never_written(tmp_path):
    out = tmp_path / "o"
    secret = "s3cr3t-Pa55"

    with ScriptedServer(book_answer) as srv:
        url = f"http://reader:{secret}@127.0.0.1:{srv.port}/v1"
        run = subprocess.run(job_cmd("A test book", [url], out, *SHAPE), capture_output=True, text=True,
                             timeout=120, env=env())
        seen = {r.headers.get("Authorization") for r in srv.requests}
    assert run.returncode == 0, run.stderr
    import base64

    assert seen == {"Basic " + base64.b64encode(f"reader:{secret}".encode()).decode()}
    assert secret not in run.stdout + run.stderr
    for p in out.iterdir():
        assert secret.encode() not in p.read_bytes(), p.name
    assert json.loads((out / "stats.json").read_text())["per_backend"][0]["url"] == srv.url


async def _trip_and_probe(url: str, serving: dict) -> list[bool]:
    from orchestrator.core.config import Backend
    from orchestrator.core.events import BackendState
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.wire.client import BackendClient

    back = anyio.Event()  # the fleet says when the backend rejoins the rotation

    def on_event(ev) -> None:
        if isinstance(ev, BackendState) and ev.healthy:
            back.set()

    async with BackendClient(Backend(url), "scripted-model") as client:
        fleet = Fleet([client], [4], on_event, probe_interval=0.1)
        async with anyio.create_task_group() as tg:
            await tg.start(fleet.run)
            for _ in range(3):  # three failures in a row take it out of rotation
                fleet.report(client, await client.chat(client.body([{"role": "user", "content": "x"}],
                                                                   max_tokens=8, temperature=0)))
            states = [fleet.loads[0].healthy]
            await anyio.sleep(1.0)  # /models answers all along, completions do not
            states.append(fleet.loads[0].healthy)
            serving["ok"] = True
            with anyio.move_on_after(5):
                await back.wait()
            states.append(fleet.loads[0].healthy)
            tg.cancel_scope.cancel()
    return states


def test_a_backend_rejoins_only_after_a_probe_completion_succeeds():
    serving = {"ok": False}

    def answer(req: Request) -> Answer:
        return Answer("OK") if serving["ok"] else Answer(status=503, error="engine dead")

    with ScriptedServer(answer) as srv:
        states = anyio.run(_trip_and_probe, srv.url, serving)
        assert srv.models_gets >= 3  # it was probed, and /models answered each time
    assert states == [False, False, True]



async def _slow_probe(url: str, dead: str, serving: dict) -> tuple[bool, bool]:
    from orchestrator.core.config import Backend
    from orchestrator.core.events import BackendState
    from orchestrator.dispatch.fleet import Fleet
    from orchestrator.wire.client import BackendClient

    settled = anyio.Event()  # a rejoined the rotation, or the fleet gave up on every backend

    def on_event(ev) -> None:
        if isinstance(ev, BackendState) and (ev.healthy or ev.url == "*"):
            settled.set()

    async with BackendClient(Backend(url), "scripted-model") as a, BackendClient(Backend(dead), "m") as b:
        fleet = Fleet([a, b], [4, 4], on_event, probe_interval=0.1, all_down_timeout=0.5)
        async with anyio.create_task_group() as tg:
            await tg.start(fleet.run)
            for c in (a, b):
                for _ in range(3):
                    fleet.report(c, await c.chat(c.body([{"role": "user", "content": "x"}], max_tokens=8,
                                                        temperature=0)))
            serving["ok"] = True  # a now answers, but its completions take 3 s (a busy engine); b stays dead
            with anyio.move_on_after(10):
                await settled.wait()
            tg.cancel_scope.cancel()
    return fleet.loads[0].healthy, fleet.all_down_error is None


def test_a_slow_probe_completion_is_alive_not_down():
    serving = {"ok": False}

    def answer(req: Request) -> Answer:
        return Answer("OK", delay_s=3) if serving["ok"] else Answer(status=503, error="busy")

    with ScriptedServer(answer) as srv:
        healthy, not_all_down = anyio.run(_slow_probe, srv.url, "http://127.0.0.1:9/v1", serving)
    assert healthy and not_all_down
