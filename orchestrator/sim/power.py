"""The card's GPU power: a draw that follows load, an energy counter, and a dcgm-exporter-like page.

Calibration. :data:`REFERENCE_POWER_W` is the reference's one-card column (``shared/reference_run.json``,
``ladder_one_card_plain``: ``gpu_power_w`` against streams, 384.6 W at 1 ... 493.7 W at 256); the draw at ``running``
streams is interpolated piecewise-linearly on that column, held at 493.7 W above 256, and falls linearly from the
1-stream draw to :data:`IDLE_W` at 0 streams. The idle draw is not in the reference: 100 W is an assumption (an
H100/H200-class card idling with a model loaded), which only matters for the time a card has nothing to run.

Time scale. With ``--time-scale X`` the card's clock is stretched X times: the same work takes X times longer, so
the same joules are spread over X times the wall seconds. The page therefore reports the draw as W / X in wall
terms and the energy counter accrues at that rate, so that joules per token (and tokens per joule) are the same at
any time scale, and a ladder's ``power_w`` x X is the model's draw.

The page (``GET /dcgm/metrics`` on the card's port) carries dcgm-exporter's default names and labels:
``DCGM_FI_DEV_POWER_USAGE`` (gauge, W) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (counter, mJ since the card
started), labelled ``gpu`` (the card's index as ``handbook sim`` numbers them), a fake ``UUID``, ``device``,
``modelName`` and ``Hostname``.
"""

from __future__ import annotations

import bisect
import time

REFERENCE_POWER_W: tuple[tuple[int, float], ...] = (
    (1, 384.6), (4, 398.9), (8, 403.4), (16, 424.5), (32, 430.8), (64, 465.0), (128, 489.3), (256, 493.7),
)
IDLE_W = 100.0
MODEL_NAME = "NVIDIA H200 (simulated)"

_XS = [0, *(n for n, _ in REFERENCE_POWER_W)]
_WS = [IDLE_W, *(w for _, w in REFERENCE_POWER_W)]


def model_power_w(running: float) -> float:
    """The card's draw in W (model time) with ``running`` streams: the reference column, interpolated."""
    if running <= 0:
        return IDLE_W
    if running >= _XS[-1]:
        return _WS[-1]
    i = bisect.bisect_right(_XS, running)
    x0, x1 = _XS[i - 1], _XS[i]
    return _WS[i - 1] + (_WS[i] - _WS[i - 1]) * (running - x0) / (x1 - x0)


class PowerMeter:
    """The card's energy counter: :meth:`advance` is told how many streams ran since the last call.

    The engine calls it at the end of every step (with the step's running count) and when it wakes from idle (with
    0); a scrape calls it with the count running now. Energy accrues at ``model_power_w(running) / time_scale``
    wall watts (see the module docstring)."""

    def __init__(self, time_scale: float = 1.0):
        self.time_scale = float(time_scale)
        self.energy_mj = 0.0
        self._t = time.monotonic()

    def advance(self, running: int) -> None:
        now = time.monotonic()
        dt = now - self._t
        if dt > 0:
            self.energy_mj += model_power_w(running) / self.time_scale * dt * 1000.0
            self._t = now

    def power_w(self, running: int) -> float:
        """The draw now, in wall watts."""
        return model_power_w(running) / self.time_scale


def dcgm_text(index: int, meter: PowerMeter, running: int, host: str = "127.0.0.1") -> bytes:
    """The card's dcgm-exporter page (Prometheus text) now."""
    meter.advance(running)
    labels = (f'gpu="{index}",UUID="GPU-5e1f0000-0000-4000-8000-{index:012d}",device="nvidia{index}",'
              f'modelName="{MODEL_NAME}",Hostname="{host}"')
    return (
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} {meter.power_w(running):.3f}\n"
        "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n"
        "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n"
        f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} {meter.energy_mj:.0f}\n"
    ).encode()
