"""Frozen configuration values: Backend, Settings, presets and TOML job files."""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .errors import ConfigError
from .settings_types import check_field_types, conforms, describe_type, show_value
from .urls import normalise_url, redact, split_credentials, split_power

__all__ = [
    "CONTEXTS", "DEFAULT_PROMPT", "JOB_KEYS", "PRESETS", "SETTING_NAMES", "STREAM_SECTIONS", "Backend", "Settings",
    "backends_from_env", "check_positive_int", "load_job_file", "normalise_url", "redact", "settings_from",
    "slugify", "split_credentials", "split_power", "unique_backends",
]

DEFAULT_PROMPT = "Write me a complete software engineering handbook"


@dataclass(frozen=True)
class Backend:
    """One OpenAI-compatible server: its base URL (ending in /v1) and its in-flight cap.

    ``power``: the Prometheus page of its GPU's power exporter (NVIDIA dcgm-exporter, :9400/metrics by default) and
    which GPU it is, ``URL[#gpu=LABEL]`` (LABEL: dcgm's ``gpu`` label or the GPU's ``UUID``; none: every GPU on the
    page, summed). Checked and normalised by :func:`split_power`; None: no power figures for this backend."""

    url: str
    cap: int = 256
    api_key: str | None = field(default=None, repr=False)  # never printed
    model: str | None = None
    # user:password given in the URL (http://user:pass@host/v1): sent as HTTP basic auth, and taken out of
    # ``url`` at once, so the URL that reaches stats.json, the journal, events and logs never carries it.
    auth: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    power: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self, "backend")
        url, auth = split_credentials(self.url)
        object.__setattr__(self, "url", normalise_url(url))
        if auth is not None:
            object.__setattr__(self, "auth", auth)
        check_positive_int("cap", self.cap)
        if self.power is not None:
            page, gpu = split_power(self.power)
            object.__setattr__(self, "power", page + (f"#gpu={gpu}" if gpu is not None else ""))

    @property
    def identity(self) -> tuple[str, str, int, str]:
        """What makes two URLs the same server: scheme, host (localhost is 127.0.0.1), port, path."""
        u = urlparse(self.url)
        host = (u.hostname or "").lower()
        if host in ("localhost", "localhost.localdomain", "127.0.0.1"):
            host = "127.0.0.1"
        port = u.port or (443 if u.scheme == "https" else 80)
        return (u.scheme, host, port, u.path.rstrip("/"))


@dataclass(frozen=True)
class Settings:
    """Everything that shapes a job. ``outline_key`` names the fields that decide the outline (resume checks)."""

    parts: int = 8
    chapters: int = 12
    sections: int = 16
    words: int = 250
    max_tokens: int = 520
    temperature: float | None = None  # None: the model profile's (0 for the reference profile)
    cap: int = 256
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never printed, never journaled
    plan_max_tokens: int = 1024
    attempts: int = 8
    pipeline: bool = True
    formats: tuple[str, ...] = ("md", "pdf")
    templates: str | None = None
    connect_timeout_s: float = 10.0
    first_token_timeout_s: float = 120.0
    chunk_timeout_s: float = 60.0
    # a request that streams longer than this is cut (a server dripping tokens just inside chunk_timeout_s, for
    # ever); far above any real section: 520 tokens at 5 tok/s per stream take under two minutes
    request_timeout_s: float = 1800.0
    metrics_interval_s: float = 0.5
    interrupt_grace_s: float = 5.0  # after the first Ctrl-C, how long requests in flight may still finish
    all_down_timeout_s: float = 30.0  # every backend out of rotation this long -> stop (exit 3)
    # How the model is asked (orchestrator/profiles.py): "auto" picks a profile by model name; each field below
    # left at None takes the profile's value, and set, overrides it.
    profile: str = "auto"
    top_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    system: str | None = None
    planning: str | None = None  # "json" or "list"
    finish_truncated: bool = False  # one short continuation request for a section stopped by the token cap
    # The forecast (orchestrator/forecasting): budgets choose the shape so the forecast fits them; ``ladder`` is a
    # `handbook bench` ladder.json to take the step times from (else a short probe of the backends' counters);
    # ``forecast`` asks for one without a budget. None of these is in the resume key: the shape they chose is.
    pages: int | None = None
    minutes: float | None = None
    ladder: str | None = None
    forecast: bool = False
    timeline: bool = False  # also write timeline.png and timeline.json: the run as a picture (orchestrator.timeline)
    # lay out each part of the PDF as soon as its last section is in (orchestrator/typeset/background.py); False:
    # the whole PDF after the last section, as before
    typeset_while_writing: bool = True
    # Section requests: "always" (the default) streams them, so that a stalled server is caught within
    # chunk_timeout_s; "auto" streams only when something reads their text as it arrives (the feed, --record, an
    # on_event asking for deltas), else asks for one whole response (wire/whole.py: less client CPU, timed by the
    # request's deadline alone: the library's default); "never". Planning always streams (the outline pipeline).
    stream_sections: str = "always"
    # What each section request knows of the book: "outline" (the default) carries the book's brief, the part's
    # chapter titles and the chapter's section titles, in an order that shares the longest prompt prefix within a
    # chapter (the servers' prefix cache computes it once); "none" the titles alone, as the reference's requests
    # did (the published preset).
    context: str = "outline"
    # With "outline", a chapter's sections prefer the backend that already holds the chapter's prompt prefix
    # (dispatch/affinity.py, within the equal-share rule and never past a cap); off only to measure what it brings
    # (benchmarks/context_cost.py).
    affinity: bool = True
    # No title twice in one book (parts, chapters, sections): the planner asks for spares and uses them. The
    # published preset turns it off, so that its plan (and its ~46 repeated section titles) stays the reference's.
    distinct_titles: bool = True
    # Checked afterwards, asked again once (job/repairs.py): a section whose code blocks do not parse, and the later
    # section of a near-duplicate pair (--repairs, on by default; off in the published preset).
    repairs: bool = True
    # A streamed section answer is stopped where the model signs off to whoever asked ("I hope this helps! Let me
    # know ..."), after at least a third of its words, and kept as the section (book/signoff.py): what it would have
    # talked on is left out of book.md anyway. Off in the published preset, whose sections are the reference's.
    stop_at_sign_off: bool = True

    def __post_init__(self) -> None:
        # Every path into Settings comes through here (Settings(...) by a library user, settings_from for the CLI's
        # merged preset, job file, environment and flags, dataclasses.replace), so the types are checked here first:
        # the range checks below may then assume them.
        for name in ("templates", "ladder"):  # paths, given as text or as a path (kept as text: journaled)
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        check_field_types(self, "setting")
        self._check_ranges()
        self._check_choices()
        object.__setattr__(self, "formats", _formats(self.formats))

    def _check_ranges(self) -> None:
        for name in ("parts", "chapters", "sections", "words", "max_tokens", "cap", "plan_max_tokens", "attempts"):
            check_positive_int(name, getattr(self, name))
        # 0 would fail every connection, every request, or spin the sampler: more than 0
        for name in ("connect_timeout_s", "first_token_timeout_s", "chunk_timeout_s", "request_timeout_s",
                     "metrics_interval_s"):
            v = getattr(self, name)
            if not 0 < v < math.inf:
                raise ConfigError(f"{name} must be a number of seconds more than 0, got {v!r}")
        # 0 means something here: no grace after Ctrl-C; stop as soon as every backend is out of rotation
        for name in ("interrupt_grace_s", "all_down_timeout_s"):
            v = getattr(self, name)
            if not 0 <= v < math.inf:
                raise ConfigError(f"{name} must be a non-negative number of seconds, got {v!r}")
        if self.pages is not None:
            check_positive_int("pages", self.pages)
        _check_number("minutes", self.minutes, 0, 10_000, low_open=True)
        _check_number("temperature", self.temperature, 0, 2)
        _check_number("top_p", self.top_p, 0, 1, low_open=True)
        _check_number("repetition_penalty", self.repetition_penalty, 0, 3, low_open=True)
        _check_number("frequency_penalty", self.frequency_penalty, -2, 2)

    def _check_choices(self) -> None:
        from .profiles import PLANNING_STYLES, PROFILE_NAMES

        if self.profile not in PROFILE_NAMES:
            raise ConfigError(f"profile must be one of {', '.join(PROFILE_NAMES)}; got {self.profile!r}")
        if self.planning is not None and self.planning not in PLANNING_STYLES:
            raise ConfigError(f"planning must be one of {', '.join(PLANNING_STYLES)}; got {self.planning!r}")
        if (got := self.stream_sections) not in STREAM_SECTIONS:
            raise ConfigError(f"stream_sections must be one of {', '.join(STREAM_SECTIONS)}; got {got!r}")
        if (got := self.context) not in CONTEXTS:
            raise ConfigError(f"context must be one of {', '.join(CONTEXTS)}; got {got!r}")

    def streams_sections(self, deltas: bool) -> bool:
        """Whether section requests stream, given whether a consumer reads their text as it arrives."""
        return self.stream_sections == "always" or (self.stream_sections == "auto" and deltas)

    def max_tokens_for(self, words: int) -> int:
        """The token cap of a section asked for ``words``: a length set in outline.md scales the cap with it, never
        below the job's own cap (the writer and the forecast both use this)."""
        return max(self.max_tokens, math.ceil(self.max_tokens * words / self.words))

    @property
    def wants_forecast(self) -> bool:
        return bool(self.forecast or self.pages or self.minutes or self.ladder)

    def outline_key(self) -> dict[str, Any]:
        return {"parts": self.parts, "chapters": self.chapters, "sections": self.sections}

    def resume_key(self) -> dict[str, Any]:
        """The settings a journal must share to be resumed: those that change the outline or the sections' text
        (the model is checked separately, once the backends have named it)."""
        return {
            **self.outline_key(),
            "words": self.words,
            "max_tokens": self.max_tokens,
            "plan_max_tokens": self.plan_max_tokens,
            "templates": self.templates,
            # only when set, so that journals written before profiles existed (temperature 0, the reference
            # profile) still resume; a journal's check compares the keys this run has
            **{k: getattr(self, k) for k in ("temperature", "top_p", "repetition_penalty", "frequency_penalty",
                                              "system", "planning") if getattr(self, k) is not None},
            **({"profile": self.profile} if self.profile not in ("auto", "reference") else {}),
        }

    def public(self) -> dict[str, Any]:
        """The settings as plain data, secrets left out (for stats, journal and events)."""
        out = {}
        for f in fields(self):
            if f.name == "api_key":
                continue
            v = getattr(self, f.name)
            out[f.name] = list(v) if isinstance(v, tuple) else v
        return out


STREAM_SECTIONS = ("auto", "always", "never")
CONTEXTS = ("outline", "none")

PRESETS: dict[str, dict[str, Any]] = {
    # Every setting of the reference run (../shared/reference_run.json, fan_out_job).
    "published-take": {
        "prompt": "Write me a complete software engineering handbook. Every topic, with examples.",
        "parts": 8,
        "chapters": 12,
        "sections": 16,
        "words": 250,
        "max_tokens": 520,
        "temperature": 0.0,
        "cap": 256,
        "profile": "reference",  # the reference's prompts and sampling, whatever the model
        "context": "none",  # each section request carries its titles alone, as the reference's did
        "distinct_titles": False,  # the reference's plan, repeated titles and all
        "repairs": False,  # nothing asked again but what failed: the reference's defects stay countable
        "stop_at_sign_off": False,  # every section read to its end, as the reference's were
    },
}

SETTING_NAMES = {f.name for f in fields(Settings)}
JOB_KEYS = SETTING_NAMES | {"prompt", "backends", "backend", "out", "format", "preset"}


# The job file's own keys (not settings): what each takes. backends/backend entries are checked by Backend.
_JOB_KEY_TYPES: dict[str, Any] = {
    "prompt": str,
    "out": str,
    "preset": str,
    "format": str | list[str],
    "backend": str | list[str | dict[str, Any]],
    "backends": str | list[str | dict[str, Any]],
}


def _check_number(name: str, v: Any, low: float, high: float, *, low_open: bool = False) -> None:
    """None (not set) or a number in [low, high] (or (low, high] with ``low_open``)."""
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{name} must be a number, got {v!r}")
    if not (low < v <= high if low_open else low <= v <= high):
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, got {v}")


def _formats(formats: tuple[str, ...]) -> tuple[str, ...]:
    """The output formats asked for, checked; md is always among them."""
    bad = [f for f in formats if f not in ("md", "html", "pdf")]
    if bad or not formats:
        raise ConfigError(f"setting 'formats' (--format): expected any of md,html,pdf; got "
                          f"{','.join(formats) or 'nothing'}")
    if "md" not in formats:
        formats = ("md", *formats)  # book.md is always written: it is what everything else is made from
    return formats


def check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")




def unique_backends(backends: list[Backend]) -> list[Backend]:
    """The same server given twice (or as localhost and 127.0.0.1) is one backend with one cap: two entries
    would double its cap and split its load figures. Keeps the first entry and says so."""
    import logging

    seen: dict[tuple[str, str, int, str], Backend] = {}
    out = []
    for b in backends:
        first = seen.get(b.identity)
        if first is not None:
            logging.getLogger("handbook").warning(
                "backend %s is the same server as %s: using it once, with cap %d", b.url, first.url, first.cap
            )
            continue
        seen[b.identity] = b
        out.append(b)
    return out








def backends_from_env() -> list[str]:
    raw = os.environ.get("HANDBOOK_BACKENDS", "")
    return [u.strip() for u in raw.split(",") if u.strip()]


def load_job_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML job file; unknown keys and syntax errors become one-line ConfigErrors with their line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read job file {p}: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"invalid TOML in {p}: {e}") from None
    for key in data:
        if key not in JOB_KEYS:
            line = _line_of_key(text, key)
            where = f" (line {line})" if line else ""
            raise ConfigError(f"unknown key {key!r} in {p}{where}; known keys: {', '.join(sorted(JOB_KEYS))}")
        tp = _JOB_KEY_TYPES.get(key)
        if tp is not None and not conforms(data[key], tp):
            line = _line_of_key(text, key)
            where = f" (line {line})" if line else ""
            raise ConfigError(f"job file {p}{where}: {key!r}: expected {describe_type(tp)}, "
                              f"got {show_value(data[key], False)}")
    return data


def _line_of_key(text: str, key: str) -> int | None:
    pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for i, line in enumerate(text.splitlines(), 1):
        if pat.match(line):
            return i
    return None


def settings_from(values: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """Build Settings from a mapping of known names (preset, job file and flags merged by the caller).

    A job's own keys that are not settings (``prompt``, ``backends``, ``out``...: JOB_KEYS) are the caller's and
    left alone; any other key is a ConfigError naming it. A value None means "not given" (the default or ``base``
    stays). ``formats`` may be one comma-separated string ("md,pdf", as --format takes it). Every other value must
    already have its field's type: Settings checks them all (check_field_types), nothing is coerced."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"settings must be a mapping of names to values, got {show_value(values, False)}")
    for key in values:
        if key not in JOB_KEYS:
            near = difflib.get_close_matches(str(key), sorted(SETTING_NAMES), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else f"; known settings: {', '.join(sorted(SETTING_NAMES))}"
            raise ConfigError(f"unknown setting {key!r}{hint}")
    known = {k: v for k, v in values.items() if k in SETTING_NAMES and v is not None}
    if isinstance(known.get("formats"), str):
        known["formats"] = tuple(x.strip() for x in known["formats"].split(",") if x.strip())
    return replace(base or Settings(), **known)


def slugify(text: str, limit: int = 60) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].rstrip("-") or "book"
