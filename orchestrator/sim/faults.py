"""Fault injection for one simulated card: which requests fail, are rate-limited, come back empty, are cut
mid-stream or hang, decided per request from a seeded generator (``--fault-seed``; random when not given)."""

from __future__ import annotations

import random

__all__ = ["FAULT_KINDS", "Faults"]

FAULT_KINDS = ("fail", "rate_limit", "empty", "drop", "hang")


class Faults:
    """The fault draws of one card and how many of each were drawn."""

    def __init__(self, rates: tuple[float, ...], seed: int | None, card: int):
        base = seed if seed is not None else random.SystemRandom().randrange(2**62)
        # Each card draws its own sequence, so a fault seed replays the same faults per card.
        self._rng = random.Random(base * 1_000_003 + card)
        self.rates = rates
        self.counts = dict.fromkeys(FAULT_KINDS, 0)

    def draw(self) -> str | None:
        """The fault of the next request (counted), or None."""
        if not any(self.rates):
            return None
        u = self._rng.random()
        acc = 0.0
        for kind, r in zip(FAULT_KINDS, self.rates, strict=True):
            acc += r
            if u < acc:
                self.counts[kind] += 1
                return kind
        return None

    def drop_point(self, n: int) -> int:
        """After how many of ``n`` tokens a dropped answer's connection is cut."""
        return self._rng.randint(1, max(1, n - 1)) if n > 1 else 1
