"""One card's prefix cache, as vLLM v1's automatic prefix caching works (vllm/v1/core/block_pool.py).

A prompt becomes a token sequence (:func:`prompt_tokens`), cut into blocks of ``block_size`` tokens; only full
blocks are cached, each named by a hash chained over its parent's (:func:`block_hashes`), so that a block is found
only when everything before it matches too. The card's KV budget is one pool of ``kv_tokens // block_size`` blocks
(:class:`BlockPool`): the cached blocks running streams hold (each counted once however many share it), the
cached blocks no stream holds (free but kept, evicted least recently used first), and the blocks that are each
stream's own (its last, partial prompt block and its generation reservation: never cached here).

The token sequence is not a real tokenizer's: it only has to be deterministic, the same for the same leading
words, and exactly :func:`~orchestrator.sim.text.count_prompt_tokens` long (so ``usage.prompt_tokens`` and all that
was calibrated on it stay as they were): per message 3 role-marker tokens, the words' tokens (word ``i`` of the
prompt counts ``round((i + 1) * 1.3) - round(i * 1.3)`` tokens, 1 or 2, so the words add up to ``round(words *
1.3)``), then an end marker. Word tokens are the word's CRC-32 (stable across processes and runs, unlike the
salted ``hash`` of a string); a word's second token is the same with bit 32 set.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

__all__ = ["BLOCK_SIZE", "BlockPool", "block_hashes", "prompt_blocks", "prompt_tokens"]

BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA
TOKENS_PER_WORD = 1.3  # as text.count_prompt_tokens counts them ...
_START, _NEWLINE, _END = 1 << 33, (1 << 33) + 1, (1 << 33) + 2  # ... with 4 chat-template tokens per message
_SECOND = 1 << 32  # a word's second token: outside CRC-32's range, so it never equals a first token
_encode = functools.partial(str.encode, encoding="utf-8", errors="surrogatepass")  # any str (a lone surrogate too)
_TWO = bytearray()  # _TWO[i]: whether word i of a prompt counts 2 tokens (grown once, shared by every request)


def _two_upto(words: int) -> bytearray:
    n = len(_TWO)
    if n < words:
        _TWO.extend(round((i + 1) * TOKENS_PER_WORD) - round(i * TOKENS_PER_WORD) - 1
                    for i in range(n, max(words, 2 * n + 64)))
    return _TWO


def _texts(content: Any) -> list[str]:
    """The texts of one message's content, as count_prompt_tokens reads them (a string, or text parts)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def _message_tokens(out: list[int], m: Any, first_word: int) -> int:
    """Append one message's tokens to ``out``; returns the prompt's word count after it."""
    role = m.get("role") if isinstance(m, dict) else None
    out += (_START, zlib.crc32(_encode(role)) if isinstance(role, str) else 0, _NEWLINE)
    words = [w for t in _texts(m.get("content") if isinstance(m, dict) else None) for w in t.split()]
    if words:
        try:
            firsts = list(map(zlib.crc32, map(str.encode, words)))
        except UnicodeEncodeError:  # a lone surrogate: rare, and the slower encoding takes any str
            firsts = list(map(zlib.crc32, map(_encode, words)))
        add = out.append
        end = first_word + len(words)
        for t, two in zip(firsts, _two_upto(end)[first_word:end]):  # a plain loop: faster than itertools' here
            add(t)
            if two:
                add(t | _SECOND)
    out.append(_END)
    return first_word + len(words)


def prompt_tokens(messages: Any) -> list[int]:
    """The prompt's token ids: as many as count_prompt_tokens counts, the same for the same leading words."""
    out: list[int] = []
    words = 0
    for m in messages if isinstance(messages, list) else [None]:  # not a list: counted as one message, no words
        words = _message_tokens(out, m, words)
    return out


def block_hashes(tokens: Sequence[int], block_size: int = BLOCK_SIZE) -> tuple[bytes, ...]:
    """The chained hashes of the full blocks of ``tokens`` (a partial last block has none: it is never cached)."""
    data = array("Q", tokens).tobytes()
    step = 8 * block_size
    h = b""
    out = []
    for a in range(0, (len(tokens) // block_size) * step, step):
        h = hashlib.blake2b(h + data[a:a + step], digest_size=16).digest()  # the parent's hash, then the block's
        out.append(h)
    return tuple(out)


def prompt_blocks(messages: Any, count: int, block_size: int = BLOCK_SIZE) -> tuple[bytes, ...]:
    """The hashes of a prompt's full blocks, over its first ``count`` tokens (``count``: the request's
    prompt_tokens, which the sequence matches; cut to it so that the blocks never outnumber ``count``)."""
    return block_hashes(prompt_tokens(messages)[:count], block_size)


class BlockPool:
    """One card's KV blocks. ``refs`` holds every cached block (by hash) with the number of running streams that
    hold it; those no stream holds (0) are also in ``free``, least recently freed first, and are evicted from
    there when new blocks need the room. ``own``: the blocks running streams hold that are not cached."""

    __slots__ = ("capacity", "evictions", "free", "held", "own", "refs")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.refs: dict[bytes, int] = {}
        self.free: OrderedDict[bytes, None] = OrderedDict()
        self.held = 0  # cached blocks with refs > 0
        self.own = 0
        self.evictions = 0

    @property
    def used(self) -> int:
        """Blocks running streams hold (shared ones once): what vLLM's KV usage counts (cached free blocks are
        free)."""
        return self.held + self.own

    def match(self, hashes: Sequence[bytes], most: int) -> int:
        """How many of the leading blocks are cached, at most ``most``: the chain stops at the first miss."""
        refs = self.refs
        n = 0
        for h in hashes:
            if n >= most or h not in refs:
                break
            n += 1
        return n

    def fits(self, hashes: Sequence[bytes], hit: int, own: int) -> bool:
        """Whether a stream fits whose first ``hit`` blocks are cached: the free cached blocks it hits stop being
        evictable, and its other prompt blocks and ``own`` blocks are new; every other free block may go."""
        refs = self.refs
        touched = sum(1 for h in hashes[:hit] if refs[h] == 0)
        return self.held + self.own + touched + len(hashes) - hit + own <= self.capacity

    def acquire(self, hashes: Sequence[bytes], own: int) -> None:
        """Hold a stream's prompt blocks (cached from now on) and ``own`` blocks, evicting free ones to fit."""
        refs, free = self.refs, self.free
        for h in hashes:
            r = refs.get(h, 0)
            if r == 0:
                free.pop(h, None)  # a hit, or a block cached after a missing parent: reused either way
                self.held += 1
            refs[h] = r + 1
        self.own += own
        over = self.held + len(free) + self.own - self.capacity
        while over > 0 and free:
            del refs[free.popitem(last=False)[0]]
            self.evictions += 1
            over -= 1

    def release(self, hashes: Sequence[bytes], own: int) -> None:
        """A stream ended: its own blocks are freed, its prompt blocks stay cached. They join the free list last
        block first, as vLLM frees them, so that a prompt's tail is evicted before the prefix it shares."""
        self.own -= own
        refs, free = self.refs, self.free
        for h in reversed(hashes):
            r = refs[h] - 1
            refs[h] = r
            if r == 0:
                free[h] = None
                self.held -= 1
