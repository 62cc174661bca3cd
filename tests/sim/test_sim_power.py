"""The simulator's dcgm-exporter-like page (issue 26, part 2): calibration, labels, energy, time scale."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from sim_http import chat_body, post

from orchestrator.metrics.power import parse_dcgm
from orchestrator.sim import power as simpower
from orchestrator.sim.power import IDLE_W, PowerMeter, model_power_w

# The reference's one-card column (shared/reference_run.json, ladder_one_card_plain): streams -> gpu_power_w
REFERENCE_W = {1: 384.6, 4: 398.9, 8: 403.4, 16: 424.5, 32: 430.8, 64: 465.0, 128: 489.3, 256: 493.7}
TS = 2.0


@pytest.fixture(scope="module")
def cards(sim_fleet):
    return sim_fleet(2, time_scale=TS)


def test_model_power_is_the_reference_column_interpolated():
    for n, w in REFERENCE_W.items():
        assert model_power_w(n) == pytest.approx(w)
    assert model_power_w(2) == pytest.approx(384.6 + (398.9 - 384.6) / 3)
    assert model_power_w(0) == IDLE_W and model_power_w(1000) == pytest.approx(493.7)
    draws = [model_power_w(n) for n in range(0, 300)]
    assert draws == sorted(draws)  # more streams never draw less


def test_energy_accrues_at_the_wall_rate(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(simpower.time, "monotonic", lambda: now[0])
    m = PowerMeter(time_scale=4.0)
    now[0] += 2.0
    m.advance(16)  # 2 wall seconds at 16 streams: 424.5 W / 4 in wall terms
    assert m.energy_mj == pytest.approx(424.5 / 4 * 2 * 1000)
    assert m.power_w(16) == pytest.approx(424.5 / 4)
    now[0] += 1.0
    m.advance(0)
    assert m.energy_mj == pytest.approx((424.5 / 4 * 2 + IDLE_W / 4) * 1000)


def test_page_labels_and_idle_draw(cards):
    for i in range(2):
        text = cards.dcgm_text(i)
        assert f'gpu="{i}"' in text and "UUID=\"GPU-" in text and "modelName=" in text
        r = parse_dcgm(text, str(i))
        assert r.matched == 1 and r.power_w == pytest.approx(IDLE_W / TS)
        assert parse_dcgm(text, str(1 - i)).matched == 0
    assert cards.power_urls == [u.removesuffix("/v1") + f"/dcgm/metrics#gpu={i}" for i, u in enumerate(cards.urls)]
    e0 = parse_dcgm(cards.dcgm_text(0)).energy_mj
    t0 = time.monotonic()
    time.sleep(0.5)
    e1 = parse_dcgm(cards.dcgm_text(0)).energy_mj
    dt = time.monotonic() - t0
    assert e0 is not None and e1 is not None
    # idle: IDLE_W / TS wall watts (bounds loose against the scrapes' own timing)
    assert 0.5 * IDLE_W / TS * dt * 1000 < e1 - e0 < 1.5 * IDLE_W / TS * dt * 1000


@pytest.mark.parametrize("streams", [1, 16])
def test_power_follows_the_running_streams(cards, streams):
    async def go() -> float:
        async with aiohttp.ClientSession() as s:
            body = chat_body("Write a long section.", stream=True, max_tokens=4000)
            tasks = [asyncio.create_task(post(s, cards.urls[0], body, limit_s=120)) for _ in range(streams)]
            try:
                for _ in range(200):
                    if cards.stats(0)["running"] == streams:
                        break
                    await asyncio.sleep(0.05)
                assert cards.stats(0)["running"] == streams
                r = parse_dcgm(cards.dcgm_text(0), "0")
                assert cards.stats(0)["running"] == streams  # still at that count after the read
                assert r.power_w is not None
                return r.power_w
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    watts = asyncio.run(go())
    assert watts * TS == pytest.approx(REFERENCE_W[streams], rel=1e-3)
