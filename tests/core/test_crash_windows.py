"""A process killed in the middle of an arena step, holding the arena's lock: before the one
store that changes the chain of start tags, or after it and before the derived state (free
lists, END tags, counters) caught up. The segment is put in the state such a death leaves,
through its bytes (tests/segment_bytes.py knows the layout), and the next process that needs
the lock must find the holder dead, rebuild the allocator from the chain and go on."""
import numpy as np
import pytest

from ..segment_bytes import (
    BUSY, CTL_LOCK, CTL_SEQ, DEAD, DELIVERED, END, FREE, GRANULE_BITS, MSG_POS, OWNER, STAGE,
    WRITING, class_of,
)


def _round_trip(rdv, n=20):
    for i in range(n):
        rdv.send("after", np.full(1000, i))
        assert rdv.recv("after", timeout=5)[0] == i


def _dead_holds_the_lock(seg):
    seg.dead_entry()
    seg.ctl(CTL_LOCK, DEAD + 1)


@pytest.mark.timeout(60)
def test_died_cutting_a_block_before_publishing_it(rdv, seg):
    G, n = seg.granules, 20
    # The remainder's tags written and the block off its list; the start tag still says FREE.
    seg.unlist(G)
    seg.side(n, FREE | (G - n))
    seg.side(G - 1, END | (G - n))
    _dead_holds_the_lock(seg)
    _round_trip(rdv)  # the next producer spins on the lock, finds its holder dead, repairs
    seg.check_allocator()
    assert rdv.stats().bytes_used == 0 and rdv.stats().largest_free == rdv.capacity


@pytest.mark.timeout(60)
def test_died_after_publishing_a_block_it_never_wrote(rdv, seg):
    G, n = seg.granules, 20
    seg.unlist(G)
    seq = seg.ctl(CTL_SEQ, size=8)
    pos = seq << GRANULE_BITS
    seg.u64(seg.block(0) + MSG_POS, pos)  # the header names the dead as the writer
    seg.mem[seg.block(0) + STAGE] = WRITING
    seg.u32(seg.block(0) + OWNER, DEAD + 1)
    seg.side(n, FREE | (G - n))
    seg.side(G - 1, END | (G - n))
    seg.side(0, BUSY | n)  # published; the remainder never listed, the counters never moved
    _dead_holds_the_lock(seg)
    assert rdv.collect_garbage() == 1  # repairs the arena, then frees the dead's block
    seg.check_allocator()
    assert rdv.stats().bytes_used == 0 and rdv.stats().largest_free == rdv.capacity
    _round_trip(rdv)


@pytest.mark.timeout(60)
def test_died_freeing_after_the_merge_was_published(rdv, seg):
    for key in ("p", "b", "c"):
        rdv.send(key, np.arange(100))
    (gp, _, n), (gb, _, nb), _c, _rest = seg.check_allocator()
    rdv.recv("p", timeout=5)  # dropped at once: p's block is free, on a list
    # Make b a view the dead process had received (off its queue, delivered to it) ...
    slot = seg.slot_with_head(gb)
    for field in (40, 44, 48):  # q_head, q_tail, count
        seg.u32(slot + field, 0)
    seg.mem[seg.block(gb) + STAGE] = DELIVERED
    seg.u32(seg.block(gb) + OWNER, DEAD + 1)
    # ... and was freeing: p's block off its list, the merge published, nothing after it.
    seg.unlist(n)
    seg.side(gb + nb - 1, END | (n + nb))
    seg.side(gp, FREE | (n + nb))
    _dead_holds_the_lock(seg)
    assert rdv.recv("c", timeout=5)[99] == 99  # dropping it waits on the lock: the dead is reclaimed
    seg.check_allocator()
    assert rdv.collect_garbage() == 0 and rdv.try_recv("b") is None
    _round_trip(rdv)
    assert rdv.stats().bytes_used == 0 and rdv.stats().live_blocks == 0
    seg.check_allocator()


@pytest.mark.timeout(60)
def test_damaged_free_lists_are_rebuilt(rdv, seg):
    rdv.send("x", np.arange(100))
    blocks = seg.check_allocator()
    g_busy = blocks[0][0]
    g_free, _, n_free = blocks[1]
    f, s = class_of(n_free)
    seg.u32(seg.heads(f, s), g_busy + 1)  # a list that points at a busy block
    _round_trip(rdv)  # noticed when taking the block off the list: rebuilt, then allocated
    seg.check_allocator()
    assert rdv.recv("x", timeout=5)[99] == 99
