"""The forecast beside the live figures: how long a job still has to go, and how good its forecast was.

A job that made a forecast emits :class:`~orchestrator.events.ForecastReady`; :class:`~orchestrator.jobstate.JobState`
keeps it, and :func:`job_eta` sets it beside where the job stands, for the terminal progress and the live feed.
The forecast's own figures are never revised: the point is to show how good the forecast was. The time still to go
may lean on the writing rate the servers count (never on chunk arrivals), and always says what it rests on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.events import ForecastReady


class JobView(Protocol):
    """What the ETA reads of the job's state (views.jobstate.JobState is one): a Protocol, so that this module
    needs nothing of the state's module, which shows the ETA (no import cycle)."""

    @property
    def forecast(self) -> ForecastReady | None: ...
    @property
    def elapsed(self) -> float: ...
    @property
    def finished(self) -> bool: ...
    @property
    def stats(self) -> dict[str, Any] | None: ...
    @property
    def total(self) -> int | None: ...
    @property
    def t0(self) -> float | None: ...
    @property
    def t_written(self) -> float | None: ...
    @property
    def tokens_asked(self) -> int: ...
    @property
    def write_base(self) -> tuple[float, float, int] | None: ...
    @property
    def last_sample(self) -> tuple[float, float] | None: ...
    @property
    def counted_backends(self) -> int | None: ...
    @property
    def metered_backends(self) -> int | None: ...

__all__ = ["BASES", "Eta", "job_eta"]

LIVE_MIN_S = 2.0  # seconds of server-counted writing before its rate is trusted for an ETA

# basis -> what the time still to go rests on, in words (the views print these)
BASES = {
    "forecast": "by the forecast",
    "forecast + live rate": "forecast + the servers' writing rate",
    "live rate": "at the servers' writing rate",
    "after writing": "sections written; forecast time after writing",
    "took": "finished",
}


@dataclass(frozen=True)
class Eta:
    """The forecast beside where the job stands.

    ``left_s`` is the time still to go by ``basis`` (a key of :data:`BASES`): "forecast" (the forecast alone),
    "forecast + live rate" (blended with the writing rate the servers count, the more so the more of the forecast
    tokens are written), "live rate" (past the forecast, which no longer says what is left), "after writing" (every
    section is in: what the forecast gives the steps after writing, less the time they have had), "took"
    (finished: 0). None when past the forecast with nothing else to go by.
    """

    forecast_s: float
    pages: int
    sections: int
    tokens: int
    elapsed_s: float
    left_s: float | None
    basis: str
    took_s: float | None = None  # the whole job as stats.json counts it, once finished
    pdf_pages: int | None = None  # typeset A5 pages, once finished (when a PDF was made)

    @property
    def basis_text(self) -> str:
        """What the time still to go rests on, in words."""
        return BASES.get(self.basis, self.basis)

    @property
    def over_s(self) -> float:
        """Seconds past the forecast (0 while within it)."""
        return max(0.0, (self.took_s if self.took_s is not None else self.elapsed_s) - self.forecast_s)

    @property
    def error_pct(self) -> float | None:
        """How far the job's time missed the forecast, in percent of the forecast (once finished)."""
        if self.took_s is None or self.forecast_s <= 0:
            return None
        return 100.0 * (self.took_s - self.forecast_s) / self.forecast_s

    @property
    def pages_error_pct(self) -> float | None:
        if self.pdf_pages is None or self.pages <= 0:
            return None
        return 100.0 * (self.pdf_pages - self.pages) / self.pages

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(over_s=self.over_s, error_pct=self.error_pct, pages_error_pct=self.pages_error_pct,
                 basis_text=self.basis_text)
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}


def job_eta(s: JobView) -> Eta | None:
    """The forecast beside where the job ``s`` stands (call under its lock); None when no forecast was made."""
    f = s.forecast
    if f is None:
        return None
    forecast_s, elapsed = max(0.0, float(f.whole_job_s)), s.elapsed
    figures: dict[str, Any] = {"forecast_s": forecast_s, "pages": f.pages, "sections": f.sections, "tokens": f.tokens}
    if s.finished:
        stats = s.stats or {}
        took, pdf = stats.get("whole_job_s"), stats.get("pdf_pages")
        if s.total is not None and f.sections < s.total:
            pdf = None  # the forecast was of the sections left to write, the PDF is of the whole book
        return Eta(
            **figures,
            elapsed_s=elapsed,
            left_s=0.0,
            basis="took",
            took_s=float(took) if isinstance(took, int | float) else elapsed,
            pdf_pages=pdf if isinstance(pdf, int) and not isinstance(pdf, bool) else None,
        )
    live = _live_whole_job_s(s)
    left: float | None
    if live is None:
        left, basis = (forecast_s - elapsed if elapsed <= forecast_s else None), "forecast"
    elif s.t_written is not None:
        left, basis = live - elapsed, "after writing"
    elif elapsed <= forecast_s:
        # Early on, the rate has seen little (and a fleet ramping up reads slow): trust it as far as it has seen
        # the forecast tokens written.
        w = min(1.0, _tokens_done(s) / f.tokens) if f.tokens > 0 else 1.0
        left, basis = (1.0 - w) * forecast_s + w * live - elapsed, "forecast + live rate"
    else:
        left, basis = live - elapsed, "live rate"
    return Eta(**figures, elapsed_s=elapsed, left_s=None if left is None else max(0.0, left), basis=basis)


def _tokens_done(s: JobView) -> int:
    """Tokens this run has written (a resumed job's forecast counts only what is left): finished nodes' usage, or
    more where the servers counted the ones in flight."""
    base, last = s.write_base, s.last_sample
    if base is None or last is None:
        return s.tokens_asked
    return max(s.tokens_asked, base[2] + int(last[1] - base[1]))


def _live_whole_job_s(s: JobView) -> float | None:
    """The whole job's seconds at the writing rate the servers count, plus the forecast's time after writing
    (assembly, typesetting), which no token rate measures; None until that rate can be trusted."""
    f = s.forecast
    if f is None or s.t0 is None:
        return None
    plan_s, write_s = f.forecast.get("plan_s"), f.forecast.get("write_s")
    after = 0.0
    if isinstance(plan_s, int | float) and isinstance(write_s, int | float):
        after = max(0.0, f.whole_job_s - plan_s - write_s)
    if s.t_written is not None:
        return s.t_written - s.t0 + after
    base, last = s.write_base, s.last_sample
    if base is None or last is None or s.counted_backends != s.metered_backends:
        return None  # a rate summed over part of the fleet would read slow
    dt, counted = last[0] - base[0], last[1] - base[1]
    if dt < LIVE_MIN_S or counted <= 0:
        return None
    return s.elapsed + max(0, f.tokens - _tokens_done(s)) * dt / counted + after
