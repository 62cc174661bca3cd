"""The simulator's prefix cache (issue 28): prompts as token sequences, chained block hashes, the block pool (LRU
eviction of free cached blocks, held blocks kept, a shared block counted once), the engine's admission and prefill
with it and without it, and the counters on a real card's /metrics and /sim/stats.

The engine tests step the model by hand (``_admit`` then ``_complete_step``), so they assert its arithmetic
without a clock. A server that cannot start makes the test fail (SimFleet raises), never skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from sim_http import chat_body, metric, one, run

from orchestrator.sim.engine import Engine, EngineConfig, Stream
from orchestrator.sim.launch import SimFleet
from orchestrator.sim.prefix import BlockPool, block_hashes, prompt_blocks, prompt_tokens
from orchestrator.sim.text import count_prompt_tokens

REPO = Path(__file__).resolve().parents[2]
BS = 16


def _messages(words: int, last: str = "", role: str = "user") -> list[dict]:
    brief = " ".join(f"w{i % 37}x{i % 11}" for i in range(words))
    return [{"role": "system", "content": "You write handbooks."}, {"role": role, "content": f"{brief} {last}"}]


def _hashes(n: int, tag: str) -> tuple[bytes, ...]:
    """n chained block hashes, distinct per tag."""
    return block_hashes([zlib.crc32(tag.encode())] * (n * BS))


def _engine(**kw) -> Engine:
    return Engine(EngineConfig(**kw))


def _stream(messages: list[dict], n: int = 8) -> Stream:
    p = count_prompt_tokens(messages)
    return Stream(p, n, prompt_blocks(messages, p))


def _finish_all(e: Engine) -> None:
    """Run steps until every running stream has finished (no clock: the step's arithmetic only)."""
    while e.running:
        e._complete_step()


# -- prompts as tokens ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "a b c"}, "not a message"],
    [{"role": "user", "content": [{"type": "text", "text": "one two\u2028three"}, {"type": "image_url"}]}],
    _messages(1), _messages(7), _messages(290, "Write the section X in about 250 words."),
    [{"role": "user", "content": "lone \ud800 surrogate\twith\nodd  spacing\x1c here"}],
])
def test_prompt_tokens_are_as_many_as_the_count(messages):
    assert len(prompt_tokens(messages)) == count_prompt_tokens(messages)


def test_same_leading_words_give_the_same_leading_tokens_and_blocks():
    tail = " in about 250 words of Markdown, with an example from the running system and no new terms."
    a, b = _messages(200, "Write the section A" + tail), _messages(200, "Write the section B" + tail)
    ta, tb = prompt_tokens(a), prompt_tokens(b)
    common = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    assert common > 200  # the system message and 200 words
    ha, hb = prompt_blocks(a, len(ta)), prompt_blocks(b, len(tb))
    assert ha[:common // BS] == hb[:common // BS] and ha[common // BS] != hb[common // BS]
    assert prompt_tokens(_messages(200, "x", role="assistant"))[:len(ta)] != ta  # the role is in the prompt


def test_block_hashes_chain_over_the_parent_and_cover_full_blocks_only():
    x, y = list(range(BS)), list(range(100, 100 + BS))
    assert len(block_hashes(x + y + [1] * (BS - 1))) == 2  # a partial block has no hash
    assert block_hashes(x + y)[1] != block_hashes(y + y)[1]  # the same block after another parent
    assert block_hashes(x + y)[0] == block_hashes(x)[0]
    assert prompt_blocks(_messages(50), 20) == block_hashes(prompt_tokens(_messages(50))[:20])  # cut to the count


def test_hashes_are_the_same_in_another_process():
    """Blocks must not depend on Python's salted str hash: two processes (and runs) hash a prompt alike."""
    code = ("from orchestrator.sim.prefix import prompt_blocks as b; "
            "print(b([{'role': 'user', 'content': 'one two three ' * 20}], 400)[-1].hex())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                           env=dict(os.environ, PYTHONHASHSEED=seed)).stdout.strip() for seed in ("1", "2")}
    here = prompt_blocks([{"role": "user", "content": "one two three " * 20}], 400)[-1].hex()
    assert outs == {here}


# -- the block pool ---------------------------------------------------------------------------------------------


def test_pool_matches_the_longest_cached_chain_at_most_as_asked():
    pool = BlockPool(100)
    a = _hashes(4, "a")
    pool.acquire(a[:3], 0)
    assert pool.match(a, 10) == 3 and pool.match(a, 2) == 2
    assert pool.match(_hashes(4, "b"), 10) == 0


def test_pool_evicts_free_blocks_least_recently_freed_first_tail_first():
    pool = BlockPool(6)
    a, b, c = _hashes(2, "a"), _hashes(2, "b"), _hashes(3, "c")
    pool.acquire(a, 0)
    pool.release(a, 0)
    pool.acquire(b, 0)
    pool.release(b, 0)
    assert pool.used == 0 and len(pool.free) == 4  # freed but cached
    pool.acquire(c, 0)  # 3 new blocks in a pool of 6 holding 4 free ones: one must go, a's tail first
    assert pool.evictions == 1 and pool.match(a, 9) == 1 and pool.match(b, 9) == 2
    pool.acquire(a[:1], 1)  # a hit on a's head (no longer evictable) and one own block: b's tail goes
    assert pool.match(b, 9) == 1 and pool.match(a, 9) == 1 and pool.used == 5


def test_pool_never_evicts_blocks_a_running_stream_holds():
    pool = BlockPool(5)
    a = _hashes(3, "a")
    pool.acquire(a, 1)
    assert not pool.fits(_hashes(2, "b"), 0, 0)  # 4 held, only 1 left
    pool.acquire(_hashes(2, "b"), 0)  # forced (the engine does so only for a stream beside none)
    assert pool.match(a, 9) == 3 and pool.evictions == 0


def test_pool_counts_a_block_shared_by_many_streams_once():
    pool = BlockPool(100)
    shared = _hashes(10, "brief")
    for k in range(50):
        hit = pool.match(shared, 10)
        assert hit == (10 if k else 0) and pool.fits(shared, hit, 1)
        pool.acquire(shared, 1)
    assert pool.used == 10 + 50 and pool.held == 10
    for _ in range(50):
        pool.release(shared, 1)
    assert pool.used == 0 and len(pool.free) == 10


# -- the engine with the cache ----------------------------------------------------------------------------------


def test_hits_cost_no_prefill_and_the_last_token_is_always_computed():
    e = _engine()
    first = _stream(_messages(290, "Write the section A."))
    e.submit(first)
    assert e._admit() == first.prompt_tokens and first.hit == 0
    second = _stream(_messages(290, "Write the section B."))
    e.submit(second)
    computed = e._admit()  # admitted while the first still runs: its blocks are held and shared
    assert second.hit > 15 and computed == second.prompt_tokens - BS * second.hit
    same = _stream(_messages(290, "Write the section A."))  # the whole prompt is cached ...
    e.submit(same)
    computed = e._admit()
    assert computed >= 1 and same.hit == (same.prompt_tokens - 1) // BS  # ... but its last token is computed
    st = e.cache_stats()
    assert st["prefix_cache_queries"] == e.prompt_tokens == sum(s.prompt_tokens for s in (first, second, same))
    assert st["prefix_cache_hits"] == BS * (second.hit + same.hit)
    assert st["prefill_tokens_computed"] == st["prefix_cache_queries"] - st["prefix_cache_hits"]


def test_a_prompt_of_whole_blocks_recomputes_its_last_block():
    msgs = [{"role": "user", "content": "w " * 34}]
    assert count_prompt_tokens(msgs) == 3 * BS  # round(34 x 1.3) + 4
    e = _engine()
    for _ in range(2):
        e.submit(_stream(msgs))
    assert e._admit() == 3 * BS + BS  # the second hits 2 of its 3 blocks: the last must be computed


def test_blocks_of_ended_streams_stay_cached_and_count_as_free():
    e = _engine()
    s = _stream(_messages(290, "A."), n=5)
    e.submit(s)
    e._admit()
    used = e.kv_used
    assert used == s.prompt_tokens and e.pool is not None and e.pool.used > 0
    _finish_all(e)
    assert e.kv_used == 0 and e.pool.used == 0 and len(e.pool.free) == len(s.blocks)
    again = _stream(_messages(290, "B."))
    e.submit(again)
    e._admit()
    assert again.hit > 0


def test_a_shared_prefix_admits_more_streams_in_the_same_budget():
    """256 section requests sharing ~330 tokens of a 350-token prompt, 520 tokens each: without the cache only
    ~198 fit 173,000 tokens; with it the prefix is counted once and all 256 run."""
    def admitted(**kw) -> tuple[int, Engine]:
        e = _engine(**kw)
        for i in range(256):
            e.submit(_stream(_messages(250, f"Write the section number {i} in about 250 words."), n=520))
        e._admit()
        return e.running, e

    plain, e = admitted(prefix_caching=False)
    need = e.buckets[0].pop().need  # 349 + 520 tokens
    assert plain == 173_000 // need < 200
    cached, e = admitted()
    assert cached == 256
    pool = e.pool
    assert pool is not None and pool.held == len(set().union(*(s.blocks for s in e.buckets[0])))
    assert pool.used == pool.held + sum(s.own for s in e.buckets[0])
    assert e.kv_used == BS * pool.held + sum(s.prompt_tokens - BS * len(s.blocks) for s in e.buckets[0])


def test_admission_evicts_free_blocks_and_is_refused_when_new_blocks_still_do_not_fit():
    e = _engine(kv_tokens=40 * BS)  # 40 blocks
    a = _hashes(8, "a")
    first = Stream(8 * BS + 5, 10 * BS, a)  # 8 prompt blocks + 11 own (ceil(293 / 16) = 19)
    e.submit(first)
    e._admit()
    _finish_all(e)
    pool = e.pool
    assert pool is not None and pool.used == 0 and len(pool.free) == 8  # cached, free
    sharer = Stream(8 * BS + 5, 10 * BS, a[:6] + _hashes(2, "b"))  # hits 6, 2 new + 11 own
    e.submit(sharer)
    e._admit()
    assert sharer.hit == 6 and pool.used == 19 and list(pool.free) == [a[7], a[6]]
    blocker = Stream(10, 20 * BS)  # 21 own blocks: 19 + 21 = 40 fit once the 2 free ones are evicted
    e.submit(blocker)
    e._admit()
    assert e.running == 2 and pool.used == 40 and pool.evictions == 2 and not pool.free
    assert pool.match(a, 8) == 6  # held blocks stay; the evicted were a's free tail
    refused = Stream(7 * BS + 3, BS, a[:6] + _hashes(1, "c"))  # hits 6 held, needs 1 + 2 new: 43 > 40
    e.submit(refused)
    assert e._admit() == 0
    assert e.running == 2 and e.num_waiting == 1 and refused.state == 1 and pool.used == 40
    e.cancel(blocker)  # its 21 own blocks are freed: now it fits
    assert e._admit() == refused.prompt_tokens - 6 * BS and refused.hit == 6 and e.running == 2


def test_without_the_cache_the_engine_is_as_before():
    e = _engine(prefix_caching=False)
    assert e.pool is None
    for last in ("A.", "B."):
        e.submit(_stream(_messages(290, last)))
    total = e._admit()
    assert total == e.prompt_tokens == e.prefix_queries == e.kv_reserved - 2 * 8 and e.prefix_hits == 0
    assert e.cache_stats()["kv_blocks"] is None


# -- on a real card ---------------------------------------------------------------------------------------------


def _two_sections(fleet: SimFleet) -> tuple[list[dict], dict]:
    """Two section requests sharing a long prefix, one after the other; their results and the card's stats."""
    bodies = [chat_body(f"{' '.join(f'brief{i % 50}' for i in range(250))} Write the section {t} in about 40 "
                        "words.", max_tokens=60) for t in ("One", "Two")]
    results = [run(one(fleet.urls[0], b)) for b in bodies]
    assert all(r["status"] == 200 for r in results)
    return results, fleet.stats(0)


def test_card_counts_prefix_hits_on_metrics_and_stats():
    with SimFleet(1, time_scale=0.05) as f:
        results, st = _two_sections(f)
        prompt = sum(r["json"]["usage"]["prompt_tokens"] for r in results)
        queries = metric(f, 0, "vllm:prefix_cache_queries_total")
        hits = metric(f, 0, "vllm:prefix_cache_hits_total")
        assert queries == prompt == metric(f, 0, "vllm:prompt_tokens_total")
        msgs = [chat_body(f"{' '.join(f'brief{i % 50}' for i in range(250))} Write the section {t} in about 40 "
                          "words.")["messages"] for t in ("One", "Two")]
        ta, tb = prompt_tokens(msgs[0]), prompt_tokens(msgs[1])
        common = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
        assert hits == BS * (common // BS) > 300  # the second request hit every full block the two share
        assert st["prefix_cache_hits"] == hits and st["prefix_cache_queries"] == queries
        assert st["prefill_tokens_computed"] == prompt - hits and st["config"]["engine"]["prefix_caching"]


def test_card_without_prefix_caching_never_hits():
    with SimFleet(1, time_scale=0.05, no_prefix_caching=True) as f:
        results, st = _two_sections(f)
        prompt = sum(r["json"]["usage"]["prompt_tokens"] for r in results)
        assert metric(f, 0, "vllm:prefix_cache_hits_total") == 0
        assert metric(f, 0, "vllm:prefix_cache_queries_total") == prompt
        assert st["prefill_tokens_computed"] == prompt and st["prefix_caching"] is False


@pytest.mark.parametrize("args, words", [(["--block-size", "0"], "--block-size"),
                                         (["--kv-tokens", "8"], "--kv-tokens")])
def test_bad_cache_flags_exit_2_with_one_line(args, words):
    p = subprocess.run([sys.executable, "-m", "orchestrator", "sim", *args], capture_output=True, text=True,
                       timeout=20, env=dict(os.environ, PYTHONPATH=str(REPO)), check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr, p
