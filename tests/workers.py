"""Child-process bodies for the multi-process tests (module level, so "spawn" can import them).

Children attach with create=False, pass a timeout to every blocking call, and report through a
multiprocessing queue or their exit code; an unexpected exception gives a non-zero exit code.
"""

import concurrent.futures
import multiprocessing
import os
import random
import time
import zlib

import numpy as np

import shmrdv

CHILD_TIMEOUT = 30.0


def payload(seed: int, nbytes: int) -> np.ndarray:
    """Deterministic bytes, so sender and checker can rebuild the same tensor independently."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def checksum(array: np.ndarray) -> int:
    return zlib.crc32(array.tobytes())


def recv_one(name, key, queue):
    """Report "ready", block in recv, then report shape, dtype and checksum of what arrived."""
    rdv = shmrdv.Rendezvous(name, create=False)
    queue.put("ready")
    view = rdv.recv(key, timeout=CHILD_TIMEOUT)
    queue.put((view.shape, view.dtype.str, checksum(view)))


def send_one_and_exit(name, key, seed, nbytes):
    rdv = shmrdv.Rendezvous(name, create=False)
    rdv.send(key, payload(seed, nbytes), timeout=CHILD_TIMEOUT)
    # Leave without closing or any interpreter cleanup: the tensor must outlive its sender.
    os._exit(0)


def send_counter(name, key, count):
    rdv = shmrdv.Rendezvous(name, create=False)
    for i in range(count):
        rdv.send(key, np.array(i, dtype=np.int64), timeout=CHILD_TIMEOUT)
    rdv.close()


def recv_expect_abort(name, key, queue):
    """Block in recv; report the abort reason, or None if a message arrived instead."""
    rdv = shmrdv.Rendezvous(name, create=False)
    queue.put("ready")
    try:
        rdv.recv(key, timeout=CHILD_TIMEOUT)
    except shmrdv.Aborted as error:
        queue.put(error.reason)
        return
    queue.put(None)


# --- stress: producers and consumers over many keys -------------------------------------------

def stress_key(index: int) -> str:
    return f"stress/{index}"


def stress_plan(producer: int, n_messages: int, n_keys: int) -> list[tuple[int, int]]:
    """(key index, element count) of every message `producer` sends, in sending order."""
    rng = random.Random(producer)
    return [(rng.randrange(n_keys), rng.randint(2, 1024)) for _ in range(n_messages)]


def stress_message(producer: int, seq: int, n_elements: int) -> np.ndarray:
    """int64 tensor whose first two elements identify it; the rest is filler."""
    message = np.random.default_rng((producer, seq)).integers(-(2**62), 2**62, n_elements)
    message[:2] = (producer, seq)
    return message


def stress_producer(name, producer, n_messages, n_keys, barrier, queue):
    rdv = shmrdv.Rendezvous(name, create=False)
    barrier.wait(CHILD_TIMEOUT)
    checksum_total = 0
    for seq, (key_index, n_elements) in enumerate(stress_plan(producer, n_messages, n_keys)):
        message = stress_message(producer, seq, n_elements)
        checksum_total += checksum(message)
        rdv.send(stress_key(key_index), message, timeout=CHILD_TIMEOUT)
    queue.put(("producer", checksum_total))


def stress_consumer(name, consumer, n_consumers, n_producers, n_messages, n_keys, barrier, queue):
    """Take this consumer's share of every key (consumers compete on each key) and report the ids
    and checksums received, and any message that arrived before an earlier one of its producer."""
    per_key = [0] * n_keys
    for producer in range(n_producers):
        for key_index, _ in stress_plan(producer, n_messages, n_keys):
            per_key[key_index] += 1
    rdv = shmrdv.Rendezvous(name, create=False)
    barrier.wait(CHILD_TIMEOUT)
    received, fifo_violations, checksum_total = [], [], 0
    for key_index, count in enumerate(per_key):
        share = count // n_consumers + (consumer < count % n_consumers)
        last_seq = {}
        for _ in range(share):
            view = rdv.recv(stress_key(key_index), timeout=CHILD_TIMEOUT)
            producer, seq = int(view[0]), int(view[1])
            if seq <= last_seq.get(producer, -1):
                fifo_violations.append((key_index, producer, seq))
            last_seq[producer] = seq
            received.append((producer, seq))
            checksum_total += checksum(view)
            del view
    queue.put(("consumer", checksum_total, received, fifo_violations))


# --- arena reclamation -------------------------------------------------------------------------

def stream_sizes(arena: int, rounds: int) -> list[int]:
    """Random sizes of 64-256 KiB adding up to at least `rounds` times the arena."""
    rng = random.Random(0)
    sizes = []
    while sum(sizes) < rounds * arena:
        sizes.append(rng.randint(64 << 10, 256 << 10))
    return sizes


def send_stream(name, key, sizes):
    rdv = shmrdv.Rendezvous(name, create=False)
    for seed, nbytes in enumerate(sizes):
        rdv.send(key, payload(seed, nbytes), timeout=CHILD_TIMEOUT)
    rdv.close()


def hold_then_release(name, key, count, release, queue):
    """Receive `count` messages and keep their views until `release`, then receive one more."""
    rdv = shmrdv.Rendezvous(name, create=False)
    views = [rdv.recv(key, timeout=CHILD_TIMEOUT) for _ in range(count)]
    queue.put([checksum(view) for view in views])
    if not release.wait(CHILD_TIMEOUT):
        raise TimeoutError("parent never released the views")
    time.sleep(0.3)  # give the parent's send time to block on the full arena
    del views
    last = rdv.recv(key, timeout=CHILD_TIMEOUT)
    queue.put(checksum(last))


def send_when_room(name, key, seed, nbytes, queue):
    """Report "sending", send one message (blocking while the arena has no room for it), then
    report the time.monotonic() at which send returned (the clock is system-wide)."""
    rdv = shmrdv.Rendezvous(name, create=False)
    data = payload(seed, nbytes)
    queue.put("sending")
    rdv.send(key, data, timeout=CHILD_TIMEOUT)
    queue.put(time.monotonic())


# --- zero copy ---------------------------------------------------------------------------------

def send_arange(name, key, n_elements, done):
    """Send arange(n) as uint32 and keep the mapping until `done`: the receiver must then see the
    pages as shared with us, so any growth in its private memory is a copy of its own."""
    rdv = shmrdv.Rendezvous(name, create=False)
    rdv.send(key, np.arange(n_elements, dtype=np.uint32), timeout=CHILD_TIMEOUT)
    if not done.wait(CHILD_TIMEOUT):
        raise TimeoutError("parent never said done")


def _memory_kib() -> tuple[int, int]:
    """(USS, RssAnon) of this process in KiB."""
    with open("/proc/self/smaps_rollup") as rollup:
        uss = sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean:", "Private_Dirty:")))
    with open("/proc/self/status") as status:
        rss_anon = next(int(line.split()[1]) for line in status if line.startswith("RssAnon:"))
    return uss, rss_anon


def recv_and_measure(name, key, queue):
    """Receive, touch every page, and report the growth of USS and RssAnon with the array's sum."""
    rdv = shmrdv.Rendezvous(name, create=False)
    uss_before, anon_before = _memory_kib()
    view = rdv.recv(key, timeout=CHILD_TIMEOUT)
    total = int(view.sum(dtype=np.uint64))
    uss_after, anon_after = _memory_kib()
    queue.put({"uss_growth_kib": uss_after - uss_before, "anon_growth_kib": anon_after - anon_before,
               "sum": total, "size": view.size})


# --- crash recovery: children that get SIGKILLed at a known point -------------------------------

def hold_view_then_wait(name, key, queue):
    """Receive one message, keep its view, report, and wait to be killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    view = rdv.recv(key, timeout=CHILD_TIMEOUT)
    queue.put(checksum(view))
    time.sleep(CHILD_TIMEOUT)


def alloc_halfway_then_wait(name, key, nbytes, queue):
    """Open an alloc block, fill half of it, report, and wait to be killed inside the block."""
    rdv = shmrdv.Rendezvous(name, create=False)
    with rdv.alloc(key, (nbytes,), np.uint8) as buf:
        buf[: nbytes // 2] = 7
        queue.put("inside")
        time.sleep(CHILD_TIMEOUT)


def send_then_wait(name, key, seed, nbytes, queue):
    """Send one message, report that send returned, and wait to be killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    rdv.send(key, payload(seed, nbytes), timeout=CHILD_TIMEOUT)
    queue.put("sent")
    time.sleep(CHILD_TIMEOUT)


def report_entry_then_recv(name, key, queue):
    """Report this handle's process-table entry, then block in recv until killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    mine = [p.entry for p in rdv.processes() if p.pid == os.getpid()]
    queue.put(max(mine))
    rdv.recv(key, timeout=CHILD_TIMEOUT)


# --- kill soak: workers that may be SIGKILLed at any moment ---------------------------------------

SOAK_MAGIC = 0x5EED_50AC
SOAK_SENT, SOAK_RECEIVED, SOAK_CORRUPT = 1, 2, 3
SOAK_RECORD = "<QQQ"  # kind, message id, checksum: one os.write each, so a kill never tears one
SOAK_BATCH = 4  # send_many / recv_many move up to this many messages


def soak_message(message_id: int, n_words: int, rng) -> np.ndarray:
    """[magic, id, length, body..., checksum of the body]: self-checking, whoever receives it."""
    words = np.empty(n_words, dtype=np.uint64)
    words[:3] = (SOAK_MAGIC, message_id, n_words)
    words[3:-1] = rng.integers(0, 2**63, n_words - 4, dtype=np.uint64)
    words[-1] = soak_checksum(words)
    return words


def soak_checksum(words: np.ndarray) -> int:
    return zlib.crc32(words[3:-1].tobytes())


def soak_check(view) -> tuple[int, bool]:
    """(message id, intact?) of a received soak message."""
    words = np.asarray(view)
    intact = (
        words.dtype == np.uint64 and words.ndim == 1 and len(words) >= 4 and int(words[0]) == SOAK_MAGIC
        and int(words[2]) == len(words) and int(words[-1]) == soak_checksum(words)
    )
    return (int(words[1]) if len(words) > 1 else -1), intact


def soak_worker(name, incarnation, n_keys, log_path, stop_path, seed):
    """Random send/alloc and receives (recv, recv_any, recv_async) on n_keys keys until the stop
    file appears; log what completed."""
    import struct

    rdv = shmrdv.Rendezvous(name, create=False)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    seq = 0
    while not os.path.exists(stop_path):
        k = pick.randrange(n_keys)
        key = f"soak-{k}"
        op = pick.random()
        message_id = incarnation << 32 | seq
        n_words = pick.choice((4, 16, 300, 5000))
        try:
            if op < 0.1:  # a batch, numbered seq, seq + 1, ...
                count = pick.randint(1, SOAK_BATCH)
                items = [(key, soak_message(message_id + i, n_words, rng)) for i in range(count)]
                try:
                    rdv.send_many(items, timeout=0.5)
                    done = count
                except shmrdv.RendezvousTimeout as exc:
                    done = exc.sent
                for i in range(done):
                    os.write(log, struct.pack(SOAK_RECORD, SOAK_SENT, message_id + i, 0))
                seq += count
                continue
            if op < 0.3:
                rdv.send(key, soak_message(message_id, n_words, rng), timeout=0.5)
            elif op < 0.45:
                with rdv.alloc(key, (n_words,), np.uint64, timeout=0.5) as buf:
                    buf[...] = soak_message(message_id, n_words, rng)
            elif op < 0.52:  # what is queued, up to a batch
                views = rdv.recv_many(key, SOAK_BATCH, timeout=0.02)
                checked = [soak_check(view) for view in views]
                del views
                for got, intact in checked:
                    os.write(log, struct.pack(SOAK_RECORD, SOAK_RECEIVED if intact else SOAK_CORRUPT, got, 0))
                continue
            else:
                if op < 0.6:  # first come, first served on two keys at once
                    other = f"soak-{(k + 1 + pick.randrange(max(1, n_keys - 1))) % n_keys}"
                    _, view = rdv.recv_any([key, other] if other != key else [key], timeout=0.02)
                elif op < 0.75:  # in line in the background, then taken or withdrawn
                    fut = rdv.recv_async(key)
                    try:
                        view = fut.result(timeout=0.02)
                    except concurrent.futures.TimeoutError:  # the builtin one from Python 3.11 on only
                        if fut.cancel():
                            continue
                        view = fut.result()  # handed over before the cancel: ours
                else:
                    view = rdv.recv(key, timeout=0.02)
                got, intact = soak_check(view)
                del view
                os.write(log, struct.pack(SOAK_RECORD, SOAK_RECEIVED if intact else SOAK_CORRUPT, got, 0))
                continue
        except shmrdv.RendezvousTimeout:
            continue
        os.write(log, struct.pack(SOAK_RECORD, SOAK_SENT, message_id, 0))
        seq += 1
    os.close(log)
    rdv.close()


def forked_child(rdv, inherited_view, queue):
    """Runs in a fork()ed child with the parent's Rendezvous object and view."""
    assert inherited_view[0] == 42  # readable: the mapping came along
    del inherited_view  # must not free the parent's block
    message = rdv.recv("to-child", timeout=CHILD_TIMEOUT)  # attaches a handle of its own
    rdv.send("to-parent", np.asarray(message) * 2)
    del message
    queue.put(sorted(p.pid for p in rdv.processes()))
    rdv.close()  # must not unregister the parent


def recv_in_line(name, key, queue):
    """Wait in line on key (blocking recv); report ("got", our pid, the value)."""
    rdv = shmrdv.Rendezvous(name, create=False)
    queue.put(("ready", os.getpid()))
    view = rdv.recv(key, timeout=CHILD_TIMEOUT)
    queue.put(("got", os.getpid(), int(view[0])))


def peer_serve(name, script, queue):
    """The other side of the TensorFlow-style cases: run `script`, a list of
    (op, key, value) with op "send", "recv" (report the value), "sleep" or
    "abort" (value: the reason)."""
    rdv = shmrdv.Rendezvous(name, create=False)
    for op, key, value in script:
        if op == "send":
            rdv.send(key, np.array([value], dtype=np.int64), timeout=CHILD_TIMEOUT)
        elif op == "recv":
            try:
                queue.put(("recv", key, int(rdv.recv(key, timeout=CHILD_TIMEOUT)[0])))
            except shmrdv.Aborted as error:
                queue.put(("aborted", key, error.reason))
        elif op == "sleep":
            time.sleep(value)
        elif op == "abort":
            rdv.abort(value)
    queue.put(("done", None, None))
    rdv.close()


def send_after_go(name, key, values, go, queue):
    """Send values to key once `go` (an Event) is set; report "sent"."""
    rdv = shmrdv.Rendezvous(name, create=False)
    go.wait(CHILD_TIMEOUT)
    for v in values:
        rdv.send(key, np.array([v], dtype=np.int64), timeout=CHILD_TIMEOUT)
    queue.put("sent")
    rdv.close()


def fork_parent(name, how):
    """A parent that holds a view and an open alloc block, then starts a child
    by `how` ("os.fork", or a multiprocessing start method) that uses the
    rendezvous itself; then sleeps until killed. Sends the child's pid under
    "parent-child"."""
    rdv = shmrdv.Rendezvous(name, create=False)
    rdv.send("parent-held", np.arange(1000))
    # held until we die: a view, and a block never sent
    held = [rdv.recv("parent-held", timeout=CHILD_TIMEOUT), rdv.alloc("parent-open", shape=(1000,), dtype=np.int64)]
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:
            try:
                fork_grandchild(rdv)
            finally:
                os._exit(0)
    else:
        child = multiprocessing.get_context(how).Process(target=fork_grandchild, args=(rdv,))
        child.start()
        pid = child.pid
    rdv.send("parent-child", np.array([pid]))
    time.sleep(CHILD_TIMEOUT)
    del held


def fork_grandchild(rdv):
    """Registers as itself (a send), then waits to be told to go."""
    rdv.send("child-pid", np.array([os.getpid()]))
    rdv.recv("child-go", timeout=CHILD_TIMEOUT)
    rdv.close()


def key_churn(name, worker, ready):
    """Make and delete keys as fast as it can (a send to a fresh key, its
    receive), until killed: deaths land inside inserts and deletes."""
    rdv = shmrdv.Rendezvous(name, create=False)
    ready.set()
    one = np.zeros(1)
    i = 0
    while True:
        key = f"churn-{worker}-{i % 64}"
        rdv.send(key, one)
        rdv.recv(key, timeout=CHILD_TIMEOUT)
        i += 1


def truncation_victim(name):
    """Attached, holding a view and with a thread waiting in recv, when the
    test truncates the segment (it writes a line to our stdin once it has).
    Every call afterwards must raise SegmentMismatch, reading the view must
    not kill us, and the waiter must end. Prints one line per check."""
    import sys
    import threading

    rdv = shmrdv.Rendezvous(name, create=False)
    rdv.send("big", np.arange(300_000, dtype=np.int64))  # 2.4 MB: most of the arena
    view = rdv.recv("big", timeout=CHILD_TIMEOUT)
    rdv.send("queued", np.arange(10))
    waited = []

    def wait():
        try:
            rdv.recv("never", timeout=CHILD_TIMEOUT)
            waited.append("returned")
        except shmrdv.SegmentMismatch as exc:
            waited.append(f"SegmentMismatch {exc}")
        except Exception as exc:  # noqa: BLE001: reported to the test
            waited.append(f"{type(exc).__name__} {exc}")

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)  # in line, asleep
    print("ready", flush=True)
    sys.stdin.readline()  # the segment has been truncated
    print(f"view sum {int(view.sum())}", flush=True)  # reads zeros past the cut; must not die
    waiter.join(CHILD_TIMEOUT)  # a waiter's periodic look notices a cut nothing has touched yet
    print(f"waiter: {waited[0] if waited else 'still waiting'}", flush=True)
    for what, call in (("send", lambda: rdv.send("after", np.zeros(4))), ("recv", lambda: rdv.recv("queued", timeout=1)),
                       ("stats", rdv.stats), ("try_recv", lambda: rdv.try_recv("queued"))):
        try:
            call()
            print(f"{what}: no error", flush=True)
        except shmrdv.SegmentMismatch as exc:
            print(f"{what}: SegmentMismatch {exc}", flush=True)
    del view
    rdv.close()
    print("closed", flush=True)


FUZZ_OP_TIMEOUT = 0.05  # seconds each operation of a fuzz worker may wait


def fuzz_worker(conn, worker):
    """Runs trials the test sends (name, seed, seconds): attaches to the
    rendezvous and makes random operations, each with a timeout, while the
    test writes random bytes into the segment. Reports ("done", counts,
    slowest operation in seconds, what it was); an operation may fail with
    any documented error, but must end within its timeout."""
    while True:
        job = conn.recv()
        if job is None:
            return
        name, seed, seconds = job
        rng = random.Random(seed)
        counts = {}
        slowest, slowest_what = 0.0, ""

        def timed(what, call):
            nonlocal slowest, slowest_what
            start = time.monotonic()
            try:
                call()
                outcome = "ok"
            except shmrdv.RendezvousError as exc:
                outcome = type(exc).__name__
            except (FileNotFoundError, PermissionError, ValueError, TypeError) as exc:
                outcome = type(exc).__name__
            took = time.monotonic() - start
            if took > slowest:
                slowest, slowest_what = took, what
            counts[outcome] = counts.get(outcome, 0) + 1

        rdv = None
        try:
            rdv = shmrdv.Rendezvous(name, create=False, timeout=FUZZ_OP_TIMEOUT)
        except (shmrdv.RendezvousError, FileNotFoundError, PermissionError) as exc:
            counts[f"attach {type(exc).__name__}"] = 1
        end = time.monotonic() + seconds
        held = []
        while rdv is not None and time.monotonic() < end:
            key = f"k{rng.randrange(8)}"
            op = rng.randrange(7)
            if op == 0:
                timed("send", lambda: rdv.send(key, np.full(rng.choice((1, 100, 3000)), worker), timeout=FUZZ_OP_TIMEOUT))
            elif op == 1:
                timed("recv", lambda: held.append(rdv.recv(key, timeout=FUZZ_OP_TIMEOUT)))
            elif op == 2:
                timed("try_recv", lambda: rdv.try_recv(key))
            elif op == 3:
                timed("recv_any", lambda: rdv.recv_any([key, "k9"], timeout=FUZZ_OP_TIMEOUT))
            elif op == 4:
                timed("stats", rdv.stats)
            elif op == 5:
                def alloc():
                    with rdv.alloc(key, (64,), np.int64, timeout=FUZZ_OP_TIMEOUT) as buf:
                        buf[...] = worker
                timed("alloc", alloc)
            else:
                timed("drop views", held.clear)
            if len(held) > 4:
                held.pop(0)
        held.clear()
        if rdv is not None:
            timed("close", rdv.close)
        conn.send(("done", counts, slowest, slowest_what))


def attach_and_wait(name, ready):
    """Attached and alive, holding nothing, until killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    ready.set()
    time.sleep(CHILD_TIMEOUT)
    rdv.close()


def insert_over_locks_naming_us(name, result):
    """Every free key slot's lock word damaged to name our own entry, then a
    send to a new key, whose insert takes the new slot's lock while it holds
    the home slot's insert lock: it must find the word stale and free it,
    not wait for itself. Reports what the key then holds."""
    from .segment_bytes import SLOT_STATE, Segment

    rdv = shmrdv.Rendezvous(name, create=False)
    me = next(p.entry for p in rdv.processes() if p.pid == os.getpid())
    seg = Segment(name)
    try:
        for i in range(seg.slots):
            slot = seg.index_off + 64 * i
            if seg.u32(slot + SLOT_STATE) != 1:  # not LIVE: where an insert may land
                seg.u32(slot, me + 1)
        rdv.send("fresh", np.arange(3))
        result.put(list(rdv.recv("fresh", timeout=5)))
    finally:
        seg.close()
        rdv.close()


def insert_keys(name, worker, n, start, queue):
    """Once start is set, send to n fresh keys; report how many were admitted."""
    rdv = shmrdv.Rendezvous(name, create=False)
    start.wait(CHILD_TIMEOUT)
    admitted = 0
    for i in range(n):
        try:
            rdv.send(f"p{worker}-{i}", np.zeros(1))
            admitted += 1
        except shmrdv.TooManyKeys:
            pass
    queue.put(admitted)
    rdv.close()


def echo_pinned_then_wait(name, cpu, count, queue):
    """Pinned to cpu: echo `count` messages of "ping" back on "pong" (so its
    waits learn where their sender runs), report "learned", then block in
    one more recv and report its checksum."""
    os.sched_setaffinity(0, {cpu})
    rdv = shmrdv.Rendezvous(name, create=False)
    for _ in range(count):
        view = rdv.recv("ping", timeout=CHILD_TIMEOUT)
        rdv.send("pong", view, timeout=CHILD_TIMEOUT)
        del view
    queue.put("learned")
    view = rdv.recv("last", timeout=CHILD_TIMEOUT)
    queue.put(checksum(view))


def send_counter_many(name, key, count, batch):
    """send_many of 0..count-1 (each a one-element int64 array), `batch` at a time."""
    rdv = shmrdv.Rendezvous(name, create=False)
    for start in range(0, count, batch):
        rdv.send_many([(key, np.array([i], dtype=np.int64)) for i in range(start, min(count, start + batch))],
                      timeout=CHILD_TIMEOUT)
    rdv.close()


def first_elements(name, key, count, queue):
    """Receive `count` messages of key in batches, dropping each once read,
    and report their first elements."""
    with shmrdv.Rendezvous(name, create=False) as rdv:
        firsts = []
        while len(firsts) < count:
            views = rdv.recv_many(key, 256, timeout=CHILD_TIMEOUT)
            firsts += [int(v.flat[0]) for v in views]
            del views
        queue.put(firsts)


def take_all_and_exit(name, key, count, queue):
    """Receive `count` messages of key, keep their views, report, and exit
    without releasing them: a dead process holding arena space."""
    rdv = shmrdv.Rendezvous(name, create=False)
    kept = [rdv.recv(key, timeout=CHILD_TIMEOUT) for _ in range(count)]
    queue.put(len(kept))
    queue.close()
    queue.join_thread()  # flushed before the exit that skips all cleanup
    os._exit(0)
