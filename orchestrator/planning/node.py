"""One planning node's request to the Dispatcher: the body of each attempt (JSON with a schema, or a few-shot list),
the check of each reply, and the value of a journaled answer. The planner (planner.py) makes one per node."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ..book.checks import norm_title as norm
from ..core.config import Settings
from ..core.profiles import Profile
from ..core.prompts import book_phrase, few_shot_messages, list_schema, render
from ..core.reply import STOPPED, Reply
from ..core.states import NodeKind
from ..dispatch.journal import StoredNode
from ..wire.client import BackendClient
from .stream import Expansion
from .titles import Titles, extract_titles, parse_titles

__all__ = ["RETRY_TEMPERATURE", "NodeRequest", "PlanContext", "keep_titles"]

RETRY_TEMPERATURE = 0.7  # planning re-asks after an unusable reply (see _NodeRequest.temperature)
# A node whose reply is short only because other nodes took its titles is asked again this many times (told which
# titles to avoid), then its next reply is taken as well as it can be: taken titles qualified by the node's own
# title. Not the whole attempts bound: a model that offered the same titles twice, told not to, offers them again.
TAKEN_REASKS = 1

log = logging.getLogger("handbook")


class PlanContext(Protocol):
    """What a node's request needs of its planner (:class:`~.planner.Planner` is one)."""

    profile: Profile
    settings: Settings
    templates: str | None
    fallback_title: str


class NodeRequest:
    """One planning node's request to the Dispatcher: the body of each attempt, the check of each reply, and the
    value of a journaled answer. Its :class:`Expansion` follows every attempt's reply as it streams."""

    def __init__(self, planner: PlanContext, name: str, n: int, want_title: bool, exp: Expansion,
                 values: dict[str, Any], spare: int = 0):
        self.planner = planner
        self.name = name  # the prompt template: book, part or chapter
        self.n = n
        self.spare = spare  # titles asked beyond n (distinct titles: see Planner)
        self.crowded = 0  # replies short of titles only because other nodes of the book had taken them
        self.want_title = want_title
        self.exp = exp
        self.values = values

    def temperature(self) -> float:
        """The job's temperature, raised to RETRY_TEMPERATURE once a reply was unusable: at temperature 0 a
        model answers a re-ask with the same reply (a small model repeating a title would fail every attempt),
        so a re-ask must be allowed to differ. Transient errors (connection, 5xx) keep the job's temperature."""
        p = self.planner.profile
        base = p.temperature if p.plan_temperature is None else p.plan_temperature
        if self.exp.unusable:
            return max(base, min(1.0, RETRY_TEMPERATURE + 0.1 * (self.exp.unusable - 1)))
        return base

    def build(self, client: BackendClient, attempt: int) -> dict[str, Any]:
        self.exp.new_attempt(attempt)  # called at the start of every attempt: the stream parser starts afresh
        p, s = self.planner.profile, self.planner.settings
        if p.planning == "list":
            return self._few_shot(client)
        note = f"Give exactly {self.n + self.spare} distinct titles." if attempt > 1 else ""
        keep = self.exp.retry_note()
        if keep:  # a re-ask, or a rerun resuming a node whose first titles were committed before a kill
            note = f"{note} {keep}".strip()
        if self.spare and attempt > 1 and (avoid := self.exp.avoid_note()):
            note = f"{note} {avoid}".strip()
        # The prompt asks for JSON only where the client will send the schema (it stops once a server refused it).
        # Without spares the template is rendered exactly as the published take's was.
        spares = {"spares": self.spare} if self.spare else {}
        text = render(self.name, self.planner.templates, json=client.structured, n=self.n, retry_note=note,
                      **spares, **self.values)
        return client.body(
            p.messages(text),
            max_tokens=s.plan_max_tokens,
            temperature=self.temperature(),
            schema=list_schema(self.n, self.want_title, self.spare),
            sampling=p.sampling(),
        )

    def _few_shot(self, client: BackendClient) -> dict[str, Any]:
        """A few-shot plain-list request (profile planning "list"): one worked example, then this node's request.
        The list's length bounds max_tokens, so a model looping on one line stops early."""
        p, s = self.planner.profile, self.planner.settings
        kind = self.name
        book = book_phrase(self.values.get("book") or self.planner.fallback_title)
        title = self.values.get(kind, "") if kind != NodeKind.BOOK else ""
        ask = self.n + max(p.plan_extra, self.spare)
        return client.body(
            few_shot_messages(kind, ask, book, title, self.planner.templates, p.system),
            max_tokens=min(s.plan_max_tokens, 16 * ask + 48),
            temperature=self.temperature(),
            sampling=p.sampling(),
        )

    def validate(self, reply: Reply) -> Titles:
        # The last attempt (or, with the profile's bounded re-asks, the reply after them) takes the reply as well
        # as it can — weak titles, fewer titles — rather than lose the book or spend more requests.
        exp, p = self.exp, self.planner.profile
        strict = exp.attempts < self.planner.settings.attempts and (
            p.plan_reasks is None or exp.unusable < p.plan_reasks
        ) and self.crowded < TAKEN_REASKS
        text, fixed, own_norms = reply.text, tuple(exp.committed), exp.norms
        if reply.finish_reason in ("length", STOPPED) and not text.endswith("\n"):
            # A reply cut at the token cap, or stopped once complete, is judged by its complete lines: its last is cut
            # mid-title ("1. Test and" became a chapter of SmolLM2-135M's book, its part's reply cut at the cap).
            text = text[: text.rfind("\n") + 1]
        if exp.watch_only:
            # The attempt's titles bind nothing (no child started from them): the reply is judged as if read whole,
            # against the book's titles as they are now (another node may have taken one since it streamed past).
            fixed, own_norms = (), set()
        offered_title, offered = extract_titles(text)
        taken = frozenset(exp.taken - own_norms)
        own = self.values.get(self.name) if self.name != NodeKind.BOOK else None  # the part's or chapter's title
        try:
            got = parse_titles(
                text, self.n, self.want_title, fixed, exp.title, exp.avoid, strict=strict,
                taken=taken, pool=tuple(exp.pool), pool_title=exp.pool_title,
                qualify=own if self.spare else None, own=own,
            )
        except ValueError:
            if self.spare and taken and self._enough_but_taken(text):
                self.crowded += 1
            exp.unusable += 1
            exp.pool.extend(offered)
            exp.pool_title = exp.pool_title or offered_title
            for t in offered:
                if norm(t) in taken:
                    exp.collide(t)
            raise
        if len(got.items) < self.n:  # the book node's last attempt: a smaller book rather than none (parse_titles)
            log.warning("%s: its replies gave %d distinct usable title(s) of the %d asked; the book has %d",
                        "the book node" if self.name == NodeKind.BOOK else f"{self.name} {own!r}", len(got.items),
                        self.n, len(got.items))
        if got.filled:
            log.warning("%s %r: its replies gave %d usable title(s) of the %d it needs; the other %d are made from "
                        "its title: %s", self.name, own, len(got.items) - got.filled, self.n, got.filled,
                        "; ".join(got.items[-got.filled:]))
        return got

    def _enough_but_taken(self, text: str) -> bool:
        """Would the reply have been usable if no other node had taken any of its titles?"""
        exp = self.exp
        try:
            parse_titles(text, self.n, self.want_title, () if exp.watch_only else tuple(exp.committed), exp.title,
                         exp.avoid)
        except ValueError:
            return False
        return True

    def restore(self, stored: StoredNode) -> Titles | None:
        value = stored.value
        if isinstance(value, dict) and isinstance(value.get("items"), list) and 1 <= len(value["items"]) <= self.n:
            # as accepted, fewer titles included (a node's last attempt may keep fewer than asked)
            return Titles(value.get("title"), tuple(str(x) for x in value["items"]))
        if value is None:  # a schema-1 journal: parse the stored reply, without touching this run's re-asks
            try:
                return parse_titles(stored.text, self.n, self.want_title, avoid=self.exp.avoid)
            except ValueError:
                return None
        return None


def keep_titles(titles: Titles) -> dict[str, Any]:
    return {"title": titles.title, "items": list(titles.items)}
