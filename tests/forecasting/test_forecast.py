"""The forecast (orchestrator.forecasting): invariants of the model, the budget fitting, the step-time sources.

Exact figures are the benchmark's business (benchmarks/forecast_accuracy.py compares them with real jobs); here:
bigger books cost more, more backends take less time, budgets are met, and the probe reads the simulator's own
engine model back from its counters.
"""

from __future__ import annotations

import json
from dataclasses import replace

import anyio
import pytest
from fake_openai import FakeServer

from orchestrator.core.config import Backend, Settings
from orchestrator.core.errors import BackendError, ConfigError
from orchestrator.core.outline import Chapter, Outline, Part
from orchestrator.forecasting import Forecast, StepFit, fit_budget, fits_from_ladder, forecast, probe_fits
from orchestrator.wire.client import discover

REF = (12.94, 0.2451)  # the reference engine model's step, ms


def fleet(n: int, cap: int = 256, a: float = REF[0], b: float = REF[1]) -> list[StepFit]:
    return [StepFit(f"http://10.0.0.{i}:8000/v1", a, b, cap, "test") for i in range(n)]


def shape(p: int, c: int, s: int, **kw) -> Settings:
    return Settings(parts=p, chapters=c, sections=s, **kw)


def outline(p: int, c: int, s: int, words: dict[str, int] | None = None) -> Outline:
    words = words or {}
    return Outline("A Book", tuple(
        Part(f"Part {pi}", tuple(
            Chapter(f"Chapter {pi}.{ci}", tuple(f"Section {pi}.{ci}.{si}" for si in range(1, s + 1)),
                    tuple(words.get(f"{pi}.{ci}.{si}") for si in range(1, s + 1)))
            for ci in range(1, c + 1)))
        for pi in range(1, p + 1)))


def test_more_sections_cost_more_tokens_words_pages_and_time():
    small = forecast(None, shape(2, 3, 4), fleet(2))
    big = forecast(None, shape(2, 3, 12), fleet(2))
    assert (small.sections, big.sections) == (24, 72)
    assert big.tokens > small.tokens and big.words > small.words and big.pages > small.pages
    assert big.whole_job_s > small.whole_job_s
    # beyond what the fleet holds at once, time grows with the work
    assert forecast(None, shape(4, 6, 16), fleet(1, cap=32)).whole_job_s > \
        1.5 * forecast(None, shape(4, 6, 8), fleet(1, cap=32)).whole_job_s


def test_more_backends_take_less_time_and_share_the_sections():
    settings = shape(4, 6, 8)
    one, three = forecast(None, settings, fleet(1, cap=64)), forecast(None, settings, fleet(3, cap=64))
    assert three.whole_job_s < one.whole_job_s
    assert (one.tokens, one.pages) == (three.tokens, three.pages)  # the book does not depend on the fleet
    assert sum(b["sections"] for b in three.per_backend) == 192
    assert all(50 <= b["sections"] <= 78 for b in three.per_backend)  # equal servers, equal shares
    # a slower server gets fewer sections
    mixed = fleet(2, cap=64)
    mixed[1] = replace(mixed[1], a_ms=4 * REF[0], b_ms=4 * REF[1])
    fast, slow = forecast(None, settings, mixed).per_backend
    assert slow["sections"] < fast["sections"]


def test_whole_job_spans_planning_and_writing():
    fc = forecast(None, shape(3, 4, 5), fleet(2))
    assert 0 < fc.plan_s < fc.whole_job_s and 0 < fc.write_s < fc.whole_job_s
    assert fc.inputs["planning"]["requests"] == 1 + 3 + 12 + 1  # the book, its parts and chapters, the brief
    strict = forecast(None, shape(3, 4, 5, pipeline=False), fleet(2))
    # strict: no section starts before the last title, so planning and writing add up
    assert strict.plan_s + strict.write_s <= strict.whole_job_s + 1e-9
    assert strict.tokens == fc.tokens


def test_the_context_and_distinct_titles_are_forecast_as_the_planner_asks():
    """--context outline: one more planning request (the brief), and a chapter's sections start once its whole list
    is in; distinct titles: part and chapter replies carry spare titles. The reference's settings forecast neither."""
    ref = forecast(None, shape(3, 4, 5, context="none", distinct_titles=False), fleet(2))
    spares = forecast(None, shape(3, 4, 5, context="none"), fleet(2))
    whole = forecast(None, shape(3, 4, 5), fleet(2))
    assert ref.inputs["planning"]["requests"] == spares.inputs["planning"]["requests"] == 1 + 3 + 12
    assert whole.inputs["planning"]["requests"] == 1 + 3 + 12 + 1
    assert ref.inputs["planning"]["tokens"] < spares.inputs["planning"]["tokens"] < whole.inputs["planning"]["tokens"]
    assert ref.plan_s <= spares.plan_s
    # sections wait for whole lists: the first starts later than when it streamed past in its chapter's list
    assert whole.whole_job_s - whole.write_s > spares.whole_job_s - spares.write_s


def test_planned_outline_has_no_planning_time():
    settings = shape(2, 3, 4)
    o = outline(2, 3, 4)
    planned = forecast(o, settings, fleet(2), planned=True)
    unplanned = forecast(o, settings, fleet(2))
    assert planned.plan_s == 0.0 and planned.inputs["planning"]["requests"] == 0
    assert unplanned.plan_s > 0
    assert planned.whole_job_s < unplanned.whole_job_s
    assert planned.tokens < unplanned.tokens  # the planning replies' tokens are not in it
    assert planned.pages == unplanned.pages == forecast(None, settings, fleet(2)).pages


def test_sections_own_words_and_sections_already_written():
    settings = shape(1, 2, 4)
    base = forecast(outline(1, 2, 4), settings, fleet(1), planned=True)
    longer = forecast(outline(1, 2, 4, {"1.1.1": 1200, "1.2.3": 1200}), settings, fleet(1), planned=True)
    assert longer.tokens > base.tokens and longer.words > base.words and longer.pages > base.pages
    assert longer.inputs["sections_with_own_words"] == 2
    half = forecast(outline(1, 2, 4), settings, fleet(1), planned=True, done={"1.1.1", "1.1.2", "1.1.3", "1.1.4"})
    assert half.tokens < base.tokens and half.pages == base.pages and half.sections == base.sections
    assert half.inputs["shape"]["to_write"] == 4


def test_forecast_is_deterministic_and_states_its_inputs():
    a = forecast(None, shape(3, 4, 5), fleet(2)).to_json()
    b = forecast(None, shape(3, 4, 5), fleet(2)).to_json()
    assert a == b
    for key in ("sections", "tokens", "pages", "whole_job_s", "per_backend", "inputs", "plan_s", "write_s", "words"):
        assert key in a
    json.dumps(a)  # plain data
    inputs = a["inputs"]
    assert [f["url"] for f in inputs["fits"]] == [f.url for f in fleet(2)]
    assert StepFit(**inputs["fits"][0]) == fleet(2)[0]  # forecast.json's fits read back as they were
    for key in ("lengths", "planning", "pages_model", "words_per_section_asked", "shape"):
        assert key in inputs
    assert {"url", "sections", "tokens", "busy_s"} <= set(a["per_backend"][0])


def test_the_reference_shape_forecasts_like_the_reference_book():
    """The published take's settings: ~1.42 tokens a word and ~7% of sections at the cap, as the reference."""
    fc = forecast(None, Settings(), fleet(6))
    assert fc.sections == 1536
    assert 1.3 < fc.tokens / fc.words < 1.5
    assert 0.03 < fc.inputs["lengths"]["sections_at_max_tokens"] / 1536 < 0.1
    assert 400_000 < fc.words < 480_000


@pytest.mark.parametrize("pages", [12, 40, 100, 400, 1500])
def test_fit_budget_pages_lands_near_the_budget(pages):
    chosen, fc, sentence = fit_budget(Settings(), fleet(2), pages=pages)
    assert abs(fc.pages - pages) <= 0.05 * pages
    assert chosen.parts <= chosen.chapters <= chosen.sections  # balanced, like the default 8 x 12 x 16
    assert chosen.words == Settings().words  # the default words whenever a shape can do it
    assert fc == forecast(None, chosen, fleet(2))
    assert str(pages) in sentence and f"{chosen.parts} parts" in sentence


def test_fit_budget_minutes_is_the_largest_book_in_time():
    fits = fleet(2)
    _, fc_small, sentence = fit_budget(Settings(), fits, minutes=0.5)
    _, fc_big, _ = fit_budget(Settings(), fits, minutes=2)
    assert fc_small.whole_job_s <= 30 and fc_big.whole_job_s <= 120
    assert fc_big.pages > fc_small.pages
    assert fc_big.whole_job_s > 0.8 * 120  # the largest that fits, not just any
    assert "--minutes 0.5" in sentence


def test_fit_budget_both_and_impossible_budgets():
    fits = fleet(2)
    _, fc, _ = fit_budget(Settings(), fits, pages=100, minutes=5)
    assert abs(fc.pages - 100) <= 5 and fc.whole_job_s <= 300
    with pytest.raises(ConfigError, match="pages"):
        fit_budget(Settings(), fits, pages=1000, minutes=0.2)
    with pytest.raises(ConfigError, match="smallest book"):
        fit_budget(Settings(), fits, pages=2)
    with pytest.raises(ConfigError, match="minutes"):
        fit_budget(Settings(), fits, minutes=0.01)
    # below one small book in time: shorter sections, not an error
    slow = fleet(1, a=400.0, b=1.0)
    one = forecast(None, shape(1, 1, 1), slow).whole_job_s
    shorter = forecast(None, shape(1, 1, 1, words=200, max_tokens=416), slow).whole_job_s
    assert shorter < one
    limit = (one + shorter) / 2
    tight, fc, sentence = fit_budget(Settings(), slow, minutes=limit / 60)
    assert tight.words < Settings().words and fc.whole_job_s <= limit
    assert tight.max_tokens < Settings().max_tokens and f"{tight.words} words" in sentence


def test_fits_from_ladder(tmp_path):
    backends = [Backend("http://127.0.0.1:9001/v1", cap=128), Backend("http://127.0.0.1:9009/v1", cap=64)]
    with pytest.raises(ConfigError, match="cannot read"):
        fits_from_ladder(tmp_path / "missing.json", backends)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        fits_from_ladder(bad, backends)
    nofit = tmp_path / "nofit.json"
    nofit.write_text(json.dumps({"levels": [], "fit": None}))
    with pytest.raises(ConfigError, match="no step-time fit"):
        fits_from_ladder(nofit, backends)
    # a ladder of one server at 13 + 0.25 N and one at 26 + 0.5 N: each gets its own; an unknown server the fit
    ladder = tmp_path / "ladder.json"
    levels = []
    for n in (8, 32, 128):
        rows = [{"url": "http://127.0.0.1:9001/v1", "sustained_tok_s": 1000 * n / (13 + 0.25 * n)},
                {"url": "http://127.0.0.1:9002/v1", "sustained_tok_s": 1000 * n / (26 + 0.5 * n)}]
        levels.append({"streams": n, "held": True, "per_backend": rows})
    ladder.write_text(json.dumps({"levels": levels, "fit": {"a_ms": 19.5, "b_ms": 0.375, "ceiling_tok_s": 2667}}))
    own, other = fits_from_ladder(ladder, backends)
    assert own.a_ms == pytest.approx(13, rel=1e-3) and own.b_ms == pytest.approx(0.25, rel=1e-3)
    assert (other.a_ms, other.b_ms) == (19.5, 0.375)
    assert (own.cap, other.cap) == (128, 64) and str(ladder) in own.source


async def _probe(urls: list[str], cap: int) -> list[StepFit]:
    pairs = []
    for url in urls:
        b = Backend(url, cap=cap)
        pairs.append((b, await discover(b, None, None)))
    return await probe_fits(pairs, Settings(cap=cap))


def test_probe_reads_the_simulators_engine_model(sim_fleet):
    step_ms, per_stream_ms, scale = 20.0, 0.5, 1.5
    cards = sim_fleet(2, step_ms=step_ms, per_stream_ms=per_stream_ms, time_scale=scale)
    fits = anyio.run(_probe, cards.urls, 32)
    assert [f.url for f in fits] == cards.urls
    for f in fits:
        assert f.cap == 32 and "probe" in f.source
        assert f.a_ms == pytest.approx(step_ms * scale, rel=0.15)
        assert f.b_ms == pytest.approx(per_stream_ms * scale, rel=0.3)
        # where the job runs (at the cap), the fitted step is close
        assert f.a_ms + 32 * f.b_ms == pytest.approx((step_ms + 32 * per_stream_ms) * scale, rel=0.08)
    assert isinstance(forecast(None, shape(1, 2, 3), fits), Forecast)


def test_probe_without_counters_says_so():
    with FakeServer("ok") as srv, pytest.raises(BackendError, match="no backend has a readable token counter"):
        anyio.run(_probe, [srv.url], 8)


def test_a_probe_measures_no_level_past_what_the_job_runs():
    from orchestrator.forecasting.probe import probe_levels

    assert probe_levels(256) == (16, 64, 256)
    assert probe_levels(256, most=36) == (9, 36)  # the embedded engine's 3 x 3 x 4 book
    assert probe_levels(256, most=1536) == (16, 64, 256)  # the cap is lower: the reference's book
    assert probe_levels(8, most=0) == (1,)


def test_the_probes_top_level_is_the_jobs_sections_unless_a_budget_chooses_them():
    from orchestrator.job.forecast_file import Budget, job_sections

    outline = Outline("B", (Part("P", (Chapter("C", ("a", "b", "c")), Chapter("D", ("e",)))),))
    assert job_sections(Settings(parts=3, chapters=3, sections=4), None) == 36
    assert job_sections(Settings(parts=3, chapters=3, sections=4), outline) == 4  # the outline's, as edited
    assert job_sections(Settings(pages=40), None) is None
    assert job_sections(Settings(minutes=2.0), outline) == 4
    chosen = Settings(pages=40, parts=2, chapters=2, sections=3)  # a budget's chosen shape keeps its --pages
    assert job_sections(chosen, None, Budget(chosen, "budget: ...")) == 12


def test_recorded_fits_are_reused_only_up_to_the_streams_they_were_measured_at(tmp_path):
    from orchestrator.job.forecast_file import _recorded_fits

    url = "http://127.0.0.1:9001/v1"
    path = tmp_path / "forecast.json"

    def record(**extra: object) -> None:
        fit = {"url": url, "a_ms": 20.0, "b_ms": 0.5, "cap": 256, "source": "probe (3, 12 streams)", **extra}
        path.write_text(json.dumps({"inputs": {"fits": [fit]}}))

    backends = [Backend(url, cap=256)]
    record(streams=12)
    assert [f.streams for f in _recorded_fits(path, backends, 12) or []] == [12]  # the same book: reused
    assert _recorded_fits(path, backends, 150) is None  # an outline edited to 150 sections: probed again
    assert _recorded_fits(path, backends, None) is None  # a budget choosing its shape: probed again
    assert _recorded_fits(path, [Backend(url, cap=8)], None) is None  # another cap: another fit, as before
    record()  # measured to the cap (or written before the field was kept)
    assert _recorded_fits(path, backends, 1536) is not None


def test_a_levels_window_holds_thirty_predicted_steps_within_bounds():
    from orchestrator.forecasting import probe

    def points(a_ms: float, b_ms: float) -> dict[str, list[dict[str, float]]]:
        return {"u": [{"streams": n, "step_ms": a_ms + b_ms * n} for n in (4, 16)]}

    assert probe._window({"u": []}, 64) == probe.PROBE_WINDOW_S  # nothing measured yet
    assert probe._window(points(20, 0.25), 256) == pytest.approx(probe.PROBE_STEPS * 0.084)  # 30 steps of 84 ms
    # a fit that predicts seconds a step (a server past what it holds) is measured for a bounded time
    assert probe._window(points(270, 20), 256) == probe.PROBE_MAX_WINDOW_S
