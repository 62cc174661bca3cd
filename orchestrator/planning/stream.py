"""A planning reply while it streams: the node's children started from the titles it completes (:class:`Expansion`,
reading them with :class:`.title_stream.TitleStream`)."""

from __future__ import annotations

from collections.abc import Callable

from ..book.checks import norm_title as norm
from .title_stream import TitleStream
from .titles import weak_title

AVOID_LISTED = 20  # at most this many titles in a re-ask's "already used elsewhere" note


class Expansion:
    """One planning node's streamed expansion: commits titles from its reply as they complete and starts children.

    The consistency rule (why early children are never wrong):

    * A title is *committed* when a child is started from it. Committed titles are final: :func:`parse_titles`
      puts them first in the node's list whatever a later reply says, and the node's book title is committed with
      its first child (children's prompts carry it).
    * Titles are committed strictly in order, only while the reply is still plausible: index < N, not a duplicate
      of a committed title (a duplicate makes the reply unusable, so we stop there), and, in a re-asked reply, only
      after that reply has repeated every committed title in place. Anything else stops early starts for that
      attempt; the remaining children start when the node's final list is known.
    * A re-asked reply is asked to keep the committed titles. If it changes its mind anyway, its new titles fill
      the positions after the committed ones (dropping any that repeat them), so a started child is never
      cancelled, renamed or duplicated.

    When every reply is usable at the first attempt (the normal case), this is just "start each child the moment
    its title streams past", and the outline is exactly what strict mode makes from the same prompts.
    """

    def __init__(
        self,
        n: int,
        want_title: bool,
        start_child: Callable[[int, str, str | None], None] | None,
        avoid: frozenset[str] = frozenset(),
        on_commit: Callable[[str | None, list[str]], None] | None = None,
        taken: set[str] | None = None,
        spares: bool = False,
        watch_only: bool = False,
    ):
        self.n = n
        # Follow each reply only to stop it once its list is complete (see watch), starting no child: its titles hold
        # for the attempt alone (no journal, no "keep these" in a re-ask, not taken for the book until the node's
        # list is accepted), as where the reply is read whole; a re-ask starts afresh.
        self.watch_only = watch_only and start_child is None
        self.on_commit = on_commit  # (book title, committed titles) -> None: journals them before the child starts
        self.avoid = avoid  # normalised ancestor titles: a child repeating one is not started (see parse_titles)
        # Titles used anywhere in the outline so far (shared by every node of a planner whose profile wants a
        # distinct outline; this node's own otherwise): a small model offers the same few titles at every level.
        self.taken: set[str] = set() if taken is None else taken
        # The node asked for spare titles (distinct titles across the book): a title already taken is skipped, not a
        # reason to stop, so the children are the first n titles of the reply, in its order, that no other node had
        # taken when they arrived. Titles are taken in the order they become known (committed from a stream, or
        # accepted with a node's final list): deterministic given the order in which replies arrive.
        self.spares = spares
        self.collided: list[str] = []  # titles offered that were taken elsewhere: the re-ask is told to avoid them
        self.attempts = 0
        self.want_title = want_title
        self.start_child = start_child  # (index, title, book title) -> None; None in strict mode
        self.committed: list[str] = []
        self.norms: set[str] = set()
        self.title: str | None = None
        self.stream: TitleStream | None = None
        self.matched = 0
        self.placed = 0
        self.following = False
        self.unusable = 0  # replies of this node that failed validation
        self.pool: list[str] = []  # every title its replies offered, for the last attempt (see parse_titles)
        self.pool_title: str | None = None

    def new_attempt(self, attempt: int | None = None) -> None:
        """A new attempt's stream (``attempt``: the Dispatcher's number for it; a body built again within one
        attempt, as after a server refused one of its fields, is the same attempt)."""
        self.attempts = self.attempts + 1 if attempt is None else attempt
        self.stream = TitleStream()
        self.matched = 0  # titles of this attempt's stream looked at
        self.placed = 0  # of them, the ones that hold a place in the node's list (committed or repeating one)
        if self.watch_only:
            self.committed, self.norms, self.title = [], set(), None
        self.following = (self.start_child is not None or self.watch_only) and len(self.committed) < self.n

    def on_delta(self, text: str) -> None:
        if not self.following:
            return
        # No try: a model's text cannot make _advance raise (TitleStream stalls on what it cannot read), so
        # whatever it raises is a bug of ours, and it must end the job as one, not be retried on a server.
        self._advance(text)

    def _advance(self, text: str) -> None:
        s = self.stream
        assert s is not None
        s.feed(text)
        if self.want_title and self.title is None and s.title is None:
            return  # children need the book title first
        items = s.items
        self._drop_taken()
        while self.matched < len(items):
            t = items[self.matched]
            self.matched += 1
            k = norm(t)
            taken = k in self.taken and k not in self.norms  # (no set difference per title: the set is the book's)
            if self.spares and taken:
                # another node of the book took it first: a spare further down the list takes its place
                self.collide(t)
                continue
            place = self.placed
            if place < len(self.committed):
                if t != self.committed[place]:
                    self.following = False
                    return
                self.placed += 1
                continue
            if place >= self.n or k in self.norms:
                self.following = False
                return
            if self.want_title and self.title is None:
                self.title = s.title
            if taken or weak_title(t, self.avoid | ({norm(self.title)} if self.title else set())):
                self.following = False
                return
            self.committed.append(t)
            self.norms.add(k)
            self.placed += 1
            if self.watch_only:
                continue
            self.taken.add(k)
            if self.on_commit is not None:
                self.on_commit(self.title, self.committed)
            assert self.start_child is not None
            self.start_child(place, t, self.title)
        if s.stalled:
            self.following = False

    def watch(self) -> Callable[[str], str | None] | None:
        """The ``stop_when`` of this node's next attempt (``Dispatcher.run``'s ``watch``), for a followed reply."""
        return self._list_complete if self.start_child is not None or self.watch_only else None

    def _list_complete(self, _delta: str) -> str | None:
        """Stop reading a text reply once all ``n`` titles are committed: they are the node's list whatever the reply
        says next (:func:`parse_titles` puts committed titles first), and what a text list says next is spares, the
        last title again and again to the token cap, or prose. A small model's chapter list ran to its cap in 4 of
        9 nodes of a book, 15 to 31 s under load, while a chapter that shows its sections their siblings waits for
        the list. A JSON reply ends with its list (a schema bounds it): it is left to end by itself, whole."""
        s = self.stream
        self._drop_taken()
        if len(self.committed) >= self.n and s is not None and s.mode == "text":
            return "the list is complete"
        return None

    def _drop_taken(self) -> None:
        """Watch-only: a title this attempt streamed that another node has taken since (its list was accepted while
        this one streamed) holds no place: the list is not complete without it, and a spare further down the reply
        takes its place, as where the reply is read whole (else the stopped reply is one title short: a re-ask)."""
        if not self.watch_only or not any(norm(t) in self.taken for t in self.committed):
            return
        for t in self.committed:
            if norm(t) in self.taken:
                self.collide(t)
        self.committed = [t for t in self.committed if norm(t) not in self.taken]
        self.norms = {norm(t) for t in self.committed}
        self.placed = len(self.committed)

    def collide(self, title: str) -> None:
        """Note a title this node offered that another node of the book had taken (for the re-ask's note)."""
        if title not in self.collided:
            self.collided.append(title)

    def restore(self, title: str | None, items: tuple[str, ...]) -> None:
        """Take the titles an earlier run committed for this node: they are final (their children exist)."""
        self.watch_only = False  # final: no attempt may start afresh without them
        self.title = title
        self.committed = list(items[: self.n])
        self.norms = {norm(t) for t in self.committed}
        self.taken.update(self.norms)  # the book's from now: another node re-asked on this rerun may not take them

    def retry_note(self) -> str:
        if not self.committed or self.watch_only:
            return ""
        keep = "; ".join(f"{i}. {t}" for i, t in enumerate(self.committed, 1))
        book = f' Keep the book title "{self.title}".' if self.title else ""
        return f"Keep these first {len(self.committed)} titles unchanged, in this order: {keep}.{book}"

    def avoid_note(self) -> str:
        """The re-ask's note naming the titles its replies offered that other nodes of the book already use (the
        latest ones, a bounded list: the prompt must not grow with the book)."""
        if not self.collided:
            return ""
        return ("These titles are already used elsewhere in the book; use none of them: "
                f"{'; '.join(self.collided[-AVOID_LISTED:])}.")

