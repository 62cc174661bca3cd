"""A failed attempt's retry goes to another backend (Dispatcher + Fleet + BackendClient against two HTTP servers on
127.0.0.1): a server's faults come in runs, so the card that just failed a request is the likeliest to fail its
retry. Here one server answers every chat request 429 (which never takes it out of rotation) and the request's
affinity key is homed on it: with two attempts, every node is answered by the other."""

from __future__ import annotations

import anyio
from fake_openai import FakeServer

from orchestrator.core.config import Backend
from orchestrator.dispatch.dispatcher import Dispatcher
from orchestrator.dispatch.fleet import Fleet
from orchestrator.wire.client import BackendClient


async def _run(bad_url: str, good_url: str) -> list:
    async with BackendClient(Backend(bad_url), "fake-model") as bad, \
            BackendClient(Backend(good_url), "fake-model") as good:
        fleet = Fleet([bad, good], [4, 4], lambda e: None)
        d = Dispatcher(fleet, lambda e: None, attempts=2, wants_deltas=False)
        outs = []
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(fleet.run)
                for k in range(4):  # one at a time: the key's home (the first backend, both idle) always has room
                    outs.append(await d.run(f"1.1.{k + 1}", "section", f"Topic {k}", lambda c, n: c.body(
                        [{"role": "user", "content": "Write one short paragraph about tests."}], max_tokens=40,
                        temperature=0), affinity=("book", 1)))
                tg.cancel_scope.cancel()
        return outs


def test_every_retry_goes_to_the_backend_that_did_not_fail_it():
    with FakeServer("retry-after", stall_count=10_000, retry_after=0.01) as bad, FakeServer("ok") as good:
        outs = anyio.run(_run, bad.url, good.url)
        assert [o.reply.ok for o in outs] == [True] * 4
        assert [o.attempts for o in outs] == [2] * 4  # the first attempt went to the key's home, which failed it
        assert {o.reply.backend for o in outs} == {good.url}
        assert len(bad.chat_requests) == 4  # never twice for one node
