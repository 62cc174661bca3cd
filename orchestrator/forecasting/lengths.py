"""How long each reply will be: a section's tokens and words from the words asked, a planning reply's tokens from
its number of titles. Deterministic: the same outline always gets the same lengths.

Sections. A model asked for A words writes a length that varies around ``WRITTEN_PER_ASKED x A`` words; its
tokens are ``TOKENS_PER_WORD x words + TOKENS_PER_SECTION`` (fenced code and Markdown cost more tokens per word
than prose, and most sections carry about one code block: the constant term); the natural length in tokens is
log-normal with sigma ``SPREAD``, and the request's ``max_tokens`` cuts it. Section i takes the quantile
``frac(0.5 + i x 0.618...)`` of that distribution (a golden-ratio sequence): long and short sections are spread
evenly through the book, as a random draw would spread them, but the same outline always gets the same lengths.

Fitted on :data:`SECTION_DATA` (the simulator's answers to the product's own section prompt, uncapped; the
simulator itself is calibrated on the reference run), and checked against the reference run at its settings: the
model gives a mean of 406 tokens per section and 6% of sections at the 520-token cap at 250 words asked; the
reference wrote 629,303 tokens for 1,536 sections (about 410 each with its 105 planning replies counted) and the
simulator's own calibration aims at "about 7%" cut by the cap.

Planning replies. A JSON list of n titles costs ``PLAN_OVERHEAD[level] + n x TOKENS_PER_TITLE[level]`` tokens
(:data:`PLAN_DATA`: the simulator's replies read from a job's journal, ``nodes.completion_tokens``); the i-th
title is complete, and its child can start (pipeline mode), about ``PLAN_TITLE_START + (i + 1) x
TOKENS_PER_TITLE`` tokens into the reply.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import Any

__all__ = ["LENGTHS", "PLANNING", "LengthModel", "PlanningModel", "golden"]

# (words asked, mean words written, mean tokens, sigma of log tokens) over 1,000 answers each of the simulator
# (sim/text.answer, model "sim-qwen3") to templates/prompts/section.j2 with max_tokens 8000 (nothing cut).
# Below ~200 words asked the simulator's answers have a floor (a first paragraph and a code block whatever the
# length asked: 60 asked -> 131 written): budgets never choose fewer than MIN_WORDS words.
SECTION_DATA: tuple[tuple[int, float, float, float], ...] = (
    (250, 288.4, 406.3, 0.169),
    (500, 583.4, 770.9, 0.164),
    (800, 942.6, 1212.3, 0.168),
    (1500, 1746.3, 2202.1, 0.156),
)
MIN_WORDS = 200

# (level, titles asked, mean completion tokens of the level's replies): simulator jobs' planning replies (their
# journal.sqlite ``nodes``), JSON-schema planning: {"title", "items"} at the book node (the book title is in the
# reply's fixed part), {"items"} below. Jobs of shapes 2 x 3 x 4, 4 x 6 x 8, 8 x 12 x 16, 3 x 5 x 12 and 6 x 4 x 6.
PLAN_DATA: tuple[tuple[int, int, float], ...] = (
    (0, 2, 27.0), (0, 3, 37.0), (0, 4, 41.0), (0, 6, 51.0), (0, 8, 68.0),
    (1, 3, 24.0), (1, 4, 32.7), (1, 5, 40.7), (1, 6, 45.0), (1, 12, 90.1),
    (2, 4, 39.2), (2, 6, 59.2), (2, 8, 72.9), (2, 12, 106.4), (2, 16, 146.8),
)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = slope x + intercept``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def golden(i: int) -> float:
    """The i-th point of the golden-ratio sequence in (0, 1): evenly spread, never 0 or 1."""
    return (0.5 + i * 0.6180339887498949) % 1.0 or 0.5


@dataclass(frozen=True)
class LengthModel:
    """Section lengths: see the module docstring."""

    written_per_asked: float
    tokens_per_word: float
    tokens_per_section: float
    spread: float
    source: str

    @classmethod
    def fitted(cls) -> LengthModel:
        asked = [float(r[0]) for r in SECTION_DATA]
        words = [r[1] for r in SECTION_DATA]
        tokens = [r[2] for r in SECTION_DATA]
        ratio = sum(words) / sum(asked)  # through the origin: written words are proportional to words asked
        per_word, per_section = _line(words, tokens)
        spread = sum(r[3] for r in SECTION_DATA) / len(SECTION_DATA)
        return cls(ratio, per_word, per_section, spread,
                   f"simulator answers at {', '.join(str(r[0]) for r in SECTION_DATA)} words asked "
                   "(forecasting/lengths.py SECTION_DATA), checked against the reference run")

    def natural_tokens(self, asked: int) -> float:
        """Mean tokens of an uncapped answer to a request for ``asked`` words."""
        return self.tokens_per_word * self.written_per_asked * asked + self.tokens_per_section

    def section(self, asked: int, max_tokens: int, u: float) -> tuple[int, float, bool]:
        """(tokens, words, cut by max_tokens) of the section at quantile ``u`` of the length distribution."""
        mean = self.natural_tokens(asked)
        mu = math.log(mean) - self.spread**2 / 2
        natural = math.exp(mu + self.spread * _inv_cdf(u))
        tokens = max(1, min(max_tokens, round(natural)))
        words = max(1.0, (tokens - self.tokens_per_section) / self.tokens_per_word)
        return tokens, words, natural >= max_tokens

    def describe(self) -> dict[str, Any]:
        return {
            "written_per_asked": round(self.written_per_asked, 4),
            "tokens_per_word": round(self.tokens_per_word, 4),
            "tokens_per_section": round(self.tokens_per_section, 1),
            "spread_sigma": round(self.spread, 4),
            "spread": "log-normal over sections, quantiles from the golden-ratio sequence (deterministic)",
            "source": self.source,
        }


@cache
def _inv_cdf(u: float) -> float:
    return NormalDist().inv_cdf(u)


@dataclass(frozen=True)
class PlanningModel:
    """Planning replies, per level (0 book, 1 part, 2 chapter): tokens per title and the reply's fixed part."""

    per_title: tuple[float, float, float]
    overhead: tuple[float, float, float]
    source: str

    @classmethod
    def fitted(cls) -> PlanningModel:
        per_title, overhead = [], []
        for level in range(3):
            rows = [r for r in PLAN_DATA if r[0] == level]
            slope, intercept = _line([float(r[1]) for r in rows], [r[2] for r in rows])
            per_title.append(slope)
            overhead.append(max(0.0, intercept))
        return cls((per_title[0], per_title[1], per_title[2]), (overhead[0], overhead[1], overhead[2]),
                   "simulator jobs' planning replies (forecasting/lengths.py PLAN_DATA)")

    def reply_tokens(self, level: int, titles: int, plan_max_tokens: int) -> int:
        return max(1, min(plan_max_tokens, round(self.overhead[level] + titles * self.per_title[level])))

    def title_done(self, level: int, i: int, plan_max_tokens: int) -> int:
        """Tokens into the reply when its i-th title (0-based) is complete: the fixed part comes first (the book
        title, ``{"items": [``) but for a closing ``]}``, about two tokens."""
        lead = max(0.0, self.overhead[level] - 2)
        return max(1, min(plan_max_tokens, round(lead + (i + 1) * self.per_title[level])))

    def describe(self) -> dict[str, Any]:
        return {"tokens_per_title": [round(x, 2) for x in self.per_title],
                "overhead_tokens": [round(x, 1) for x in self.overhead],
                "levels": ["book", "part", "chapter"], "source": self.source}


LENGTHS = LengthModel.fitted()
PLANNING = PlanningModel.fitted()
