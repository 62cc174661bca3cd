"""Fitting a book to a budget: the shape (and, for a budget smaller than one small book, the words) whose forecast
fits ``--pages N`` and/or ``--minutes M``.

Shapes are balanced like the default 8 x 12 x 16: parts <= chapters <= sections per chapter, and among the shapes
whose pages fit, the one nearest the default's proportions (chapters ~1.5 x parts, sections ~1.33 x chapters) is
taken. Pages are a closed form (:mod:`.pages`), so every candidate shape is weighed; time needs the fleet
simulation, so ``--minutes`` searches the page count by interpolation, a dozen forecasts at most.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

from ..core.config import Settings
from ..core.errors import ConfigError
from .lengths import LENGTHS, MIN_WORDS, golden
from .model import Forecast, StepFit, forecast
from .pages import PAGES

__all__ = ["fit_budget"]

PAGES_TOLERANCE = (0.02, 0.05)  # pages aimed at: within 2% when a shape allows it, else within 5%
MAX_PARTS, MAX_CHAPTERS, MAX_SECTIONS = 32, 48, 64  # per level; 98,304 sections at most
IDEAL = (math.log(12 / 8), math.log(16 / 12))  # the default shape's proportions, in logs
MINUTES_STEPS = 12  # forecasts a --minutes search makes at most


def fit_budget(settings: Settings, fits: Sequence[StepFit], *, pages: int | None = None,
               minutes: float | None = None) -> tuple[Settings, Forecast, str]:
    """Choose parts, chapters and sections (and words, only when the budget is below one small book at
    ``settings.words``) so that the forecast fits: ``pages`` within ~5% of the forecast's pages, ``minutes`` at
    least its whole-job time (the largest such book when pages are not given). Returns the new settings, their
    forecast and one sentence saying what was chosen and why. ConfigError when nothing fits."""
    if pages is None and minutes is None:
        fc = forecast(None, settings, fits)
        return settings, fc, f"no budget: {_describe(settings, fc)}"
    if pages is not None and pages < 1:
        raise ConfigError(f"--pages must be at least 1, got {pages}")
    if minutes is not None and not minutes > 0:
        raise ConfigError(f"--minutes must be more than 0, got {minutes}")
    limit = None if minutes is None else minutes * 60.0
    if pages is not None:
        chosen, fc = _for_pages(settings, fits, pages, limit)
        why = f"--pages {pages}" + (f" within --minutes {minutes:g}" if minutes is not None else "")
    else:
        assert limit is not None and minutes is not None
        chosen, fc = _for_minutes(settings, fits, limit)
        why = f"--minutes {minutes:g}: the largest book forecast to finish in time"
    return chosen, fc, f"{why}: {_describe(chosen, fc)}"


def _describe(s: Settings, fc: Forecast) -> str:
    return (f"{s.parts} parts x {s.chapters} chapters x {s.sections} sections ({fc.sections:,} sections) at "
            f"{s.words} words, forecast {fc.pages:,} A5 pages in {_duration(fc.whole_job_s)}")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"


class _Words:
    """Words written by the first n sections at one words-asked setting (prefix sums, grown on demand)."""

    def __init__(self, asked: int, max_tokens: int):
        self.asked, self.max_tokens = asked, max_tokens
        self.sums = [0.0]

    def first(self, n: int) -> float:
        while len(self.sums) <= n:
            i = len(self.sums) - 1
            self.sums.append(self.sums[-1] + LENGTHS.section(self.asked, self.max_tokens, golden(i))[1])
        return self.sums[n]

    def mean(self) -> float:
        return self.first(1000) / 1000


def _pages(shape: tuple[int, int, int], words: _Words) -> float:
    p, c, s = shape
    return PAGES.pages(p, p * c, p * c * s, words.first(p * c * s))


def _shapes(max_sections: int) -> Iterator[tuple[int, int, int]]:
    """Every balanced shape (parts <= chapters <= sections per chapter) of at most ``max_sections`` sections."""
    for p in range(1, MAX_PARTS + 1):
        if p**3 > max_sections:
            return
        for c in range(p, MAX_CHAPTERS + 1):
            if p * c * c > max_sections:
                break
            for s in range(c, MAX_SECTIONS + 1):
                if p * c * s > max_sections:
                    break
                yield p, c, s


def _distance(shape: tuple[int, int, int]) -> float:
    p, c, s = shape
    return (math.log(c / p) - IDEAL[0]) ** 2 + (math.log(s / c) - IDEAL[1]) ** 2


def _candidates(target: float, words: _Words, *, closest: bool = False) -> list[tuple[int, int, int]]:
    """Shapes whose pages are within the tolerance of ``target``, nearest the default's proportions first; none
    when no shape comes that close, unless ``closest`` (then the shape nearest in pages)."""
    most = max(8, math.ceil(2.0 * target / _per_section_pages(words)))
    scored = [(abs(_pages(sh, words) - target) / target, sh) for sh in _shapes(most)]
    for tol in PAGES_TOLERANCE:
        inside = [sh for err, sh in scored if err <= tol]
        if inside:
            return sorted(inside, key=lambda sh: (_distance(sh), abs(_pages(sh, words) - target)))
    return [min(scored)[1]] if closest and scored else []


def _with_words(settings: Settings, words: int) -> Settings:
    """``words`` asked per section, max_tokens scaled with it (the same headroom over the words asked)."""
    if words == settings.words:
        return settings
    return replace(settings, words=words, max_tokens=max(16, round(settings.max_tokens * words / settings.words)))


def _shaped(settings: Settings, shape: tuple[int, int, int]) -> Settings:
    return replace(settings, parts=shape[0], chapters=shape[1], sections=shape[2])


def _for_pages(settings: Settings, fits: Sequence[StepFit], pages: int,
               limit: float | None) -> tuple[Settings, Forecast]:
    for base in _word_steps(settings):
        words = _Words(base.words, base.max_tokens)
        shapes = _candidates(pages, words)
        if not shapes:
            continue
        slowest: Forecast | None = None
        for shape in shapes[:8]:  # the best-proportioned few: their times barely differ (same pages, same tokens)
            chosen = _shaped(base, shape)
            fc = forecast(None, chosen, fits)
            if limit is None or fc.whole_job_s <= limit:
                return chosen, fc
            slowest = fc
        assert slowest is not None and limit is not None
        raise ConfigError(f"a book of about {pages:,} pages needs about {_duration(slowest.whole_job_s)} on these "
                          f"backends: more than --minutes {limit / 60:g}")
    smallest = _pages((1, 1, 1), _Words(MIN_WORDS, _with_words(settings, MIN_WORDS).max_tokens))
    if pages > smallest:
        largest = _pages((MAX_PARTS, MAX_CHAPTERS, MAX_SECTIONS), _Words(settings.words, settings.max_tokens))
        raise ConfigError(f"--pages {pages:,}: the largest book a budget chooses is about {math.floor(largest):,} "
                          f"A5 pages ({MAX_PARTS} parts x {MAX_CHAPTERS} chapters x {MAX_SECTIONS} sections); give "
                          "--parts/--chapters/--sections/--words yourself for more")
    raise ConfigError(f"--pages {pages}: the smallest book is about {math.ceil(smallest)} A5 pages "
                      "(a title page, the contents, a part page and one section)")


def _word_steps(settings: Settings) -> list[Settings]:
    """The job's words, then fewer (down to MIN_WORDS): a budget below one small book shortens the sections."""
    out = [settings]
    w = settings.words
    while w > MIN_WORDS:
        w = max(MIN_WORDS, round(w * 0.8))
        out.append(_with_words(settings, w))
    return out


def _for_minutes(settings: Settings, fits: Sequence[StepFit], limit: float) -> tuple[Settings, Forecast]:
    """The largest book forecast within ``limit`` seconds (to within 1% of it). Time grows with pages nearly in
    proportion, so the search starts from what the fleet writes at its caps in that time and steps in proportion
    to the time left, then interpolates between a book that fits and one that does not: a few forecasts."""
    for base in _word_steps(settings):
        words = _Words(base.words, base.max_tokens)
        fc = forecast(None, _shaped(base, (1, 1, 1)), fits)
        if fc.whole_job_s > limit:
            continue
        best = (_shaped(base, (1, 1, 1)), fc)
        lo, t_lo = _pages((1, 1, 1), words), fc.whole_job_s
        hi: float | None = None
        t_hi = 0.0
        most = _per_section_pages(words) * MAX_PARTS * MAX_CHAPTERS * MAX_SECTIONS
        target = min(most, max(2 * lo, _pages_in(limit, base, fits, words)))
        for _ in range(MINUTES_STEPS):
            chosen = _shaped(base, _candidates(target, words, closest=True)[0])
            got = forecast(None, chosen, fits)
            if got.whole_job_s <= limit:
                if got.pages > best[1].pages:
                    best = (chosen, got)
                lo, t_lo = target, got.whole_job_s
                if t_lo >= 0.99 * limit or target >= most:
                    break
            else:
                hi, t_hi = target, got.whole_job_s
            if hi is None:  # still inside: step up in proportion to the time left
                target = min(most, target * min(2.0, max(1.02, 0.995 * limit / got.whole_job_s)))
                continue
            if hi - lo <= max(1.0, 0.005 * lo):
                break
            frac = (0.995 * limit - t_lo) / (t_hi - t_lo) if t_hi > t_lo else 0.5
            target = lo + min(0.9, max(0.1, frac)) * (hi - lo)
        return best
    raise ConfigError(f"--minutes {limit / 60:g}: even a one-section book of {MIN_WORDS} words is forecast to take "
                      f"longer on these backends")


def _per_section_pages(words: _Words) -> float:
    """Pages per section, about: its words and its share of the headings and contents."""
    return PAGES.per_section + PAGES.per_chapter / 3 + words.mean() / PAGES.words_per_page


def _pages_in(limit: float, base: Settings, fits: Sequence[StepFit], words: _Words) -> float:
    """Pages the fleet writes in ``limit`` seconds at its caps: where the search for --minutes starts."""
    tok_s = sum(1000.0 * f.cap / (f.a_ms + f.b_ms * f.cap) for f in fits)
    per_section = sum(LENGTHS.section(base.words, base.max_tokens, golden(i))[0] for i in range(200)) / 200
    return 0.8 * limit * tok_s / per_section * _per_section_pages(words)
