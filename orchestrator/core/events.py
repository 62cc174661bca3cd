"""The one stream of events a job emits.

The terminal progress, the live feed and a library caller's ``on_event`` all consume these same values. Events are
emitted from the job's event loop; a consumer must be quick and must not block (the feed coalesces). The journal is
written by the Dispatcher itself, not from events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .outline import Outline
    from .reply import Reply
    from .states import NodeKind


@dataclass(frozen=True)
class JobStarted:
    prompt: str
    backends: tuple[str, ...]
    settings: dict[str, Any]
    t: float


@dataclass(frozen=True)
class NodeStarted:
    """An attempt at a node began on a backend (kind: book, part, chapter, section)."""

    path: str
    kind: NodeKind
    title: str
    backend: str
    attempt: int
    t: float


@dataclass(frozen=True)
class Delta:
    """A piece of streamed text of a node's current attempt. Only emitted when the job was asked for them
    (``generate(..., deltas=True)``)."""

    path: str
    text: str
    t: float


@dataclass(frozen=True)
class NodeFinished:
    """A node's reply was accepted."""

    path: str
    kind: NodeKind
    title: str
    reply: Reply
    t: float


@dataclass(frozen=True)
class NodeFailed:
    """An attempt failed. ``final`` is True when no attempt is left: the node is lost for this run. ``unusable``: the
    backend answered, and a check of ours refused the answer (``Reply.unusable``): no failure of the backend's."""

    path: str
    kind: NodeKind
    title: str
    backend: str
    attempt: int
    error: str
    final: bool
    t: float
    unusable: bool = False


@dataclass(frozen=True)
class LevelPlanned:
    """Every node of a planning level is known (level 1: parts, 2: chapters, 3: sections)."""

    level: int
    nodes: int
    t: float


@dataclass(frozen=True)
class OutlineReady:
    outline: Outline
    t: float


@dataclass(frozen=True)
class ProbeStarted:
    """The forecast is measuring the servers' step times (forecasting/probe.py): ``levels``, the streams each
    backend runs at once, in turn; ``backends``, how many are measured together. Emitted before JobStarted, whose
    clock it does not start (a probe's seconds are not the job's): a `handbook plan`, `--pages` or `--minutes` run
    otherwise shows nothing for the tens of seconds it takes."""

    levels: tuple[int, ...]
    backends: int
    t: float


@dataclass(frozen=True)
class ForecastReady:
    """What the job is forecast to take (orchestrator.forecast), emitted before the first request when a forecast
    was made (--pages, --minutes, --ladder, --forecast, or `handbook write` after `handbook plan`).
    ``whole_job_s`` counts from JobStarted.t, as stats.json's whole_job_s does; ``forecast`` is forecast.json."""

    whole_job_s: float
    pages: int
    sections: int
    tokens: int
    forecast: dict[str, Any]
    t: float


@dataclass(frozen=True)
class BackendState:
    """A backend left or rejoined the rotation."""

    url: str
    healthy: bool
    reason: str
    t: float


@dataclass(frozen=True)
class MetricsSample:
    """One sampling round of every backend's /metrics (server-counted, never client-timed).

    ``tokens`` is the summed generation-token counter; ``rate_tok_s`` the summed rate over the last second;
    ``per_backend`` maps url -> {"tokens", "running", "waiting"} (values None where a server lacks them).
    """

    t: float
    tokens: float | None
    rate_tok_s: float | None
    per_backend: dict[str, dict[str, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class JobFinished:
    stats: dict[str, Any]
    complete: bool
    t: float


Event = (
    JobStarted
    | NodeStarted
    | Delta
    | NodeFinished
    | NodeFailed
    | LevelPlanned
    | OutlineReady
    | ForecastReady
    | ProbeStarted
    | BackendState
    | MetricsSample
    | JobFinished
)
