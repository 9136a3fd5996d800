"""A segment's bytes as a test sees them: the layout (version 8) and helpers that read and
poke it, to put a segment in the state a death or damage leaves. One place for every offset
the tests rely on; csrc/rdv_layout.h pins the same offsets with _Static_asserts."""
import mmap
import struct

from .conftest import segment_path

HEADER = 8192  # two pages; the process table follows
GRANULE = 64
GRANULE_BITS = 30
MIN_BLOCK = 4  # granules
MARKS = 3 * 64 + 1024  # marks[0]; 32 B each
ARENA_CTL = MARKS + 32 * 64
MAX_KEYS = 64 + 16
LEASES_DROPPED = 64 + 28
SEG_FLAGS = 64 + 32  # RDV_CREATE_* of the creator
PROC_ENTRY = 256
KEY_COUNT = 32  # in a process entry: net << 27 | change in progress
MARK_RECORD = 44 + 4 * 43  # in a process entry
# in a process entry (rdv_arena.c): its kept block's position + 1, and the position + 1 it is
# giving another's kept block that it takes to free
KEPT_POS, DROPPING = 64 + 8, 64 + 16
DEAD = 100  # a process-table entry that no live process holds

BUSY, FREE, END = 0x40000000, 0x80000000, 0xC0000000
SL_BITS, SL_COUNT, FL_COUNT = 4, 16, GRANULE_BITS - 4 + 1
# struct rdv_arena_ctl
CTL_LOCK, CTL_CURSOR, CTL_SEQ, CTL_LIVE_BYTES, CTL_FREE_BYTES, CTL_LIVE_BLOCKS, CTL_FL = 0, 4, 8, 16, 24, 32, 40
CTL_SPACE_WANTING = 64 + 16  # two u64: a bit per process entry short of space
CTL_SL, CTL_HEADS = 128, 128 + 4 * FL_COUNT
# struct rdv_slot
SLOT_STATE, SLOT_Q_HEAD, SLOT_Q_TAIL, SLOT_COUNT = 8, 40, 44, 48
# struct rdv_msg
MSG_POS, STAGE, OWNER, FLAGS = 16, 31, 36, 38
WRITING, QUEUED, DELIVERED = 1, 2, 3
LEASED, KEPT = 1, 4


def kind(v):
    return v & 0xC0000000


def length(v):
    return v & 0x3FFFFFFF


def granule_of(pos):
    return pos & ((1 << GRANULE_BITS) - 1)


def class_of(n):
    if n < SL_COUNT:
        return 0, n
    m = n.bit_length() - 1
    return m - SL_BITS + 1, (n >> (m - SL_BITS)) ^ SL_COUNT


class Segment:
    def __init__(self, name):
        self._file = open(segment_path(name), "r+b")
        self.mem = mmap.mmap(self._file.fileno(), 0)
        self.index_off, self.slots = struct.unpack_from("<QQ", self.mem, 24)
        self.side_off, self.arena_off, self.cap = struct.unpack_from("<QQQ", self.mem, 40)
        self.granules = self.cap // GRANULE

    def close(self):
        self.mem.close()
        self._file.close()

    def u32(self, off, value=None):
        if value is not None:
            struct.pack_into("<I", self.mem, off, value)
        return struct.unpack_from("<I", self.mem, off)[0]

    def u64(self, off, value=None):
        if value is not None:
            struct.pack_into("<Q", self.mem, off, value)
        return struct.unpack_from("<Q", self.mem, off)[0]

    def side(self, g, value=None):
        return self.u32(self.side_off + 4 * g, value)

    def ctl(self, field, value=None, size=4):
        op = self.u32 if size == 4 else self.u64
        return op(ARENA_CTL + field, value)

    @property
    def next_pos(self):
        """The position the next block gets, while the free block at the cursor holds it."""
        return self.ctl(CTL_SEQ, size=8) << GRANULE_BITS | self.ctl(CTL_CURSOR)

    def heads(self, f, s):
        """Offset of free list (f, s)'s head."""
        return ARENA_CTL + CTL_HEADS + 4 * (SL_COUNT * f + s)

    def unlist(self, n):
        """Empty the free list blocks of n granules go on, as a dead holder had begun to."""
        f, s = class_of(n)
        self.u32(self.heads(f, s), 0)
        self.ctl(CTL_SL + 4 * f, self.ctl(CTL_SL + 4 * f) & ~(1 << s))

    def slot_with_key_count(self, count):
        """Offset of the one live key slot with count messages queued."""
        live = [self.index_off + 64 * i for i in range(self.slots)
                if self.u32(self.index_off + 64 * i + SLOT_STATE) == 1
                and self.u32(self.index_off + 64 * i + SLOT_COUNT) == count]
        assert len(live) == 1, live
        return live[0]

    def slot_with_head(self, g):
        """Offset of the live key slot whose queue starts at granule g."""
        for i in range(self.slots):
            at = self.index_off + 64 * i
            if self.u32(at + 8) == 1 and self.u32(at + 40) == g + 1:
                return at
        raise AssertionError(f"no queue starts at granule {g}")

    def block(self, g):
        """Offset of the block at granule g in the file."""
        return self.arena_off + g * GRANULE

    def entry(self, i):
        return HEADER + PROC_ENTRY * i

    def dead_entry(self, i=DEAD):
        """Entry i: registered (ALIVE) but nobody holds its kernel lock."""
        struct.pack_into("<II", self.mem, self.entry(i), 1, 999_999)

    def chain(self):
        """The start tags from granule 0: [(granule, kind, length)]."""
        out, g = [], 0
        while g < self.granules:
            v = self.side(g)
            assert kind(v) in (BUSY, FREE) and 0 < length(v) <= self.granules - g, f"chain broken at {g}: {v:#x}"
            out.append((g, kind(v), length(v)))
            g += length(v)
        return out

    def check_allocator(self):
        """The allocator's invariants: the chain covers the arena, free blocks are coalesced,
        tagged and each on the list of its class, and the counters agree."""
        blocks = self.chain()
        free = {g: n for g, k, n in blocks if k == FREE}
        for (g, k, n), (g2, k2, _) in zip(blocks, blocks[1:]):
            assert not (k == FREE and k2 == FREE), f"free blocks at {g} and {g2} not coalesced"
        for g, n in free.items():
            assert self.side(g + n - 1) == END | n, f"free block at {g} has no END tag"
        listed = {}
        for f in range(FL_COUNT):
            for s in range(SL_COUNT):
                link, prev = self.u32(ARENA_CTL + CTL_HEADS + 4 * (SL_COUNT * f + s)), 0
                for _ in range(self.granules):
                    if not link:
                        break
                    g = link - 1
                    assert g in free and class_of(free[g]) == (f, s) and g not in listed
                    assert self.side(g + 2) == prev
                    listed[g] = True
                    prev, link = link, self.side(g + 1)
        assert set(listed) == set(free), "every free block is on a list"
        live = [n for _, k, n in blocks if k == BUSY]
        assert self.ctl(CTL_LIVE_BLOCKS, size=8) == len(live)
        assert self.ctl(CTL_LIVE_BYTES, size=8) == GRANULE * sum(live)
        assert self.ctl(CTL_FREE_BYTES, size=8) == GRANULE * sum(free.values())
        return blocks
