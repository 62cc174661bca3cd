"""Model profiles: how to ask a given model so that what it writes is worth reading.

A profile is the sampling (temperature, top_p, repetition and frequency penalties), an optional system message,
the planning style (JSON schema, or few-shot plain lists) and the section prompt a model can follow. Two are
built in:

* ``reference`` — the published run's way of asking: temperature 0, no penalty, no system message, JSON-schema
  planning, the reference section prompt. Any model we do not know gets it (a server such as vLLM then applies
  the model's own generation config for everything we leave out), and ``--preset published-take`` forces it so
  the take stays comparable.
* ``small`` — measured on the embedded engine (SmolLM2-135M-Instruct on vLLM's CPU build). What the probes showed:
  a JSON-schema planning prompt gets prompt echoes back ("Title: Software Engineering Handbook", "items"); a
  zero-shot "List 4 section titles..." gets the parent's title repeated with numbers or dates; the same request
  after one worked example exchange (few-shot) gets real, distinct titles. The reference section prompt at
  temperature 0 repeats its title line to the token cap; a system message, a plain "Explain X in about N words"
  request, temperature 0.3 and repetition_penalty 1.1 get readable prose that mostly ends by itself.

Every field can be overridden by a flag or a job-file key (Settings), which wins over the profile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class Profile:
    name: str
    temperature: float = 0.0
    top_p: float | None = None
    repetition_penalty: float | None = None  # vLLM's sampling extension (1.0 = off)
    frequency_penalty: float | None = None  # OpenAI's (0 = off)
    system: str | None = None  # a system message sent before every request
    planning: str = "json"  # "json": JSON schema where the server takes it; "list": few-shot numbered lists
    plan_temperature: float | None = None  # planning requests' temperature (None: ``temperature``)
    # List planning asks for this many titles more than it needs and keeps the first distinct ones that pass
    # the title gate: a small model's list often holds a repeat or its parent's title, and one request with
    # spares is cheaper than a re-ask.
    plan_extra: int = 0
    # No title may repeat one used anywhere else in the outline (the reference repeats some section titles across
    # chapters, and its take keeps them; a small model repeats the same few titles at every level).
    distinct_outline: bool = False
    section_template: str = "section"  # templates/prompts/<name>.j2
    # The book brief's request (``--context outline``), templates/prompts/<name>.j2; None: no brief is asked (a model
    # that copies it into its sections instead of following it: the "small" profile's, measured in its comment).
    brief_template: str | None = "brief"
    # How many unusable planning replies a node may re-ask before its next reply is taken as well as it can be
    # (None: as many as the job's attempts). Bounds planning cost on a model that rarely gets a list right.
    plan_reasks: int | None = None
    # A section caught in a repetition loop is asked once more with these settings: the temperature, and the
    # repetition penalty, never below the first answer's (a user's --repetition-penalty above it wins).
    loop_repetition_penalty: float = 1.3
    loop_temperature: float = 0.7

    def sampling(self) -> dict[str, Any]:
        """The request fields beyond temperature and max_tokens (only those set)."""
        out: dict[str, Any] = {}
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.repetition_penalty is not None and self.repetition_penalty != 1.0:
            out["repetition_penalty"] = self.repetition_penalty
        if self.frequency_penalty:
            out["frequency_penalty"] = self.frequency_penalty
        return out

    def loop_sampling(self) -> dict[str, Any]:
        """Sampling for the one re-ask of a looping section (its temperature is ``loop_temperature``): the profile's
        loop repetition penalty, or the first answer's where that is higher."""
        out = self.sampling()
        out["repetition_penalty"] = max(self.loop_repetition_penalty, self.repetition_penalty or 1.0)
        return out

    def messages(self, user: str) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return [*msgs, {"role": "user", "content": user}]


PROFILES: dict[str, Profile] = {
    "reference": Profile("reference"),
    "small": Profile(
        "small",
        temperature=0.3,
        repetition_penalty=1.1,
        system="You are an expert writer. Write clear, factual prose.",
        planning="list",
        plan_temperature=0.0,  # titles at 0 were the most distinct and on topic; re-asks rise to 0.7 (planning/)
        plan_extra=2,
        distinct_outline=True,
        section_template="section_small",
        # No brief: SmolLM2-135M writes one as a fictional blurb (invented authors, "translated into 250
        # languages") and then copies its sentences into section after section, which runs them to the token cap
        # (benchmarks/context_quality.py, 2 x 3 x 4 on the embedded engine: with the brief 763 tokens a section, 13
        # of 16 cut at the cap, a third longer whole job per section; with the titles alone 257-279 tokens, 3 of
        # 21-22 cut). Its section requests carry the chapter's titles (and a brief a person wrote in outline.md).
        brief_template=None,
        plan_reasks=1,
        # The loop re-ask differs from the first answer by its temperature (0.7) alone. A heavier penalty makes
        # SmolLM2-135M write word salad: vLLM's repetition penalty weighs on every token already in the prompt or the
        # answer, function words too, until none is left to write (book/salad.py). The 36 sections of `make demo`'s
        # outline asked at temperature 0.7 (benchmarks/loop_reask_settings.py): penalty 1.3 (this profile's re-ask
        # until stop 40) 28 in salad, 22 of them from their first sentence, all 36 cut at the token cap; 1.2 23 (12);
        # 1.15 16 (3); 1.1 (two runs) 0 and 1, none from the start, with 0 and 1 still looping; 1.05 1 salad and 2
        # loops; 1.0 13 loops. The section whose first answer looped in that demo, asked 6 times each: 1.3 wrote
        # salad 6 times, 1.1 neither salad nor a loop.
        loop_repetition_penalty=1.1,
    ),
}

# Models that are "small" when the profile is "auto": the embedded engine's and its siblings (a few hundred
# million parameters follow a worked example far better than an instruction).
_SMALL_MODELS = re.compile(r"smollm|\b(?:135|360)m\b|-(?:135|360)m|0\.5b|tinyllama", re.IGNORECASE)

PROFILE_NAMES = ("auto", *PROFILES)
PLANNING_STYLES = ("json", "list")


def resolve_profile(settings: Any, model: str) -> Profile:
    """The profile a job uses with ``model``: ``settings.profile`` ("auto" picks by model name), with every
    sampling field the settings set explicitly taking precedence."""
    name = settings.profile
    if name == "auto":
        name = "small" if _SMALL_MODELS.search(model or "") else "reference"
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {settings.profile!r}; known: {', '.join(PROFILE_NAMES)}")
    p = PROFILES[name]
    overrides = {
        k: getattr(settings, k)
        for k in ("temperature", "top_p", "repetition_penalty", "frequency_penalty", "system", "planning")
        if getattr(settings, k) is not None
    }
    return replace(p, **overrides)
