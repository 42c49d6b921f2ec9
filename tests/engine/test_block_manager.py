from __future__ import annotations

import codecs

from portachat.engine.block_manager import BlockManager
from portachat.engine.detokenizer import Detokenizer
from portachat.engine.sequence import Sequence
from portachat.engine.types import SamplingParams


def seq_of(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), Detokenizer(lambda t: b"", []), None, 0)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq_of(list(range(10)))
    assert bm.blocks_needed(s, 10) == 3 and bm.can_allocate(s, 10)
    bm.allocate(s, 10)
    assert len(s.block_table) == 3 and len(set(s.block_table)) == 3 and bm.num_free == 5
    bm.allocate(s, 12)  # still fits in 3 blocks
    assert len(s.block_table) == 3
    assert not bm.can_allocate(s, 33)  # would need 9 blocks of 8
    bm.free_sequence(s)
    assert bm.num_free == 8 and s.block_table == [] and bm.usage() == 0.0


def test_prefix_reuse_shares_blocks_with_refcounts():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(list(range(13)), "a")
    bm.allocate(a, 13)
    a.num_computed = 13
    bm.register_full_blocks(a)
    assert len(a.block_hashes) == 3
    b = seq_of(list(range(8)) + [99, 98, 97, 96, 95], "b")
    cached = bm.match_prefix(b)
    assert cached == 8 and b.block_table == a.block_table[:2]
    assert bm.refcount[a.block_table[0]] == 2
    bm.allocate(b, 13)
    assert b.block_table[2] != a.block_table[2]
    # Freeing a keeps b's shared blocks alive.
    shared = a.block_table[:2]
    bm.free_sequence(a)
    assert all(bm.refcount[x] == 1 for x in shared)
    assert bm.prefix_hits == 2


def test_whole_prompt_cached_still_leaves_last_token_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq_of(list(range(8)), "a")
    bm.allocate(a, 8)
    a.num_computed = 8
    bm.register_full_blocks(a)
    b = seq_of(list(range(8)), "b")
    assert bm.match_prefix(b) == 4  # the second block holds the last token, which must run


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq_of([1, 2, 3, 4, 5], "a")
    bm.allocate(a, 5)
    a.num_computed = 5
    bm.register_full_blocks(a)
    bm.free_sequence(a)
    assert bm.num_free == 4
    b = seq_of([1, 2, 3, 4, 7], "b")
    assert bm.match_prefix(b) == 4 and bm.num_free == 2
    bm.free_sequence(b)
    # Fill the cache with other content: the old prefix is evicted and no longer matches.
    c = seq_of(list(range(100, 108)), "c")
    bm.allocate(c, 8)
    bm.free_sequence(c)
    d = seq_of([1, 2, 3, 4, 7], "d")
    assert bm.match_prefix(d) == 0


def test_prefix_caching_off_never_matches():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False)
    a = seq_of([1, 2, 3, 4, 5])
    bm.allocate(a, 5)
    a.num_computed = 5
    bm.register_full_blocks(a)
    assert bm.match_prefix(seq_of([1, 2, 3, 4, 5], "b")) == 0


def test_detokenizer_holds_split_characters_and_stop_prefixes():
    text = "价格是 42 元。STOP 之后"
    data = text.encode()
    pieces = [data[i : i + 2] for i in range(0, len(data), 2)]  # splits 3-byte characters
    table = dict(enumerate(pieces))
    d = Detokenizer(table.__getitem__, ["STOP"])
    out = []
    for i in range(len(pieces)):
        d.add(i)
        delta = d.delta()
        assert "\ufffd" not in delta and "S" not in delta
        out.append(delta)
        if d.stopped:
            break
    out.append(d.delta(final=True))
    assert "".join(out) == "价格是 42 元。"
    # Without stop strings everything comes out, exactly once.
    d = Detokenizer(table.__getitem__, [])
    streamed = ""
    for i in range(len(pieces)):
        d.add(i)
        streamed += d.delta()
    streamed += d.delta(final=True)
    assert streamed == codecs.decode(data, "utf-8")
