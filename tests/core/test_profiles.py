"""Profiles (core/profiles.py): the sampling a looping section's re-ask is sent with."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.core.profiles import PROFILES, resolve_profile


def _settings(**kw):
    fields = {"profile": "auto", "temperature": None, "top_p": None, "repetition_penalty": None,
              "frequency_penalty": None, "system": None, "planning": None}
    return SimpleNamespace(**{**fields, **kw})


def test_the_small_profiles_loop_reask_differs_by_temperature_not_by_a_heavier_penalty():
    small = resolve_profile(_settings(), "smollm2-135m-instruct")
    assert small.name == "small"
    # a heavier penalty makes SmolLM2-135M write word salad (the profile's comment: 28 of 36 sections at 1.3)
    assert small.loop_sampling()["repetition_penalty"] == small.sampling()["repetition_penalty"] == 1.1
    assert small.loop_temperature > small.temperature
    # a user's penalty above the profile's is kept for the re-ask: never weaker than the first answer
    heavy = resolve_profile(_settings(repetition_penalty=1.25), "smollm2-135m-instruct")
    assert heavy.sampling()["repetition_penalty"] == heavy.loop_sampling()["repetition_penalty"] == 1.25


def test_the_reference_profiles_loop_reask_is_unchanged():
    reference = PROFILES["reference"]
    assert "repetition_penalty" not in reference.sampling()
    assert reference.loop_sampling()["repetition_penalty"] == 1.3 and reference.loop_temperature == 0.7
    assert resolve_profile(_settings(), "Qwen/Qwen3-32B").loop_sampling()["repetition_penalty"] == 1.3
