"""The C hot paths (shmrdv/_fastpath.c): send of an array of a form sent
before, recv of a descriptor seen before, and the views every receive makes.
Each must give exactly what the Python paths give, fall back to them for
everything else, and never lose or leak a block."""
import gc
import signal
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv import _fastpath, allocation, forms, receiving, rendezvous, segments, waits
from shmrdv._native import ffi

from ..conftest import swap_caches

MiB = 1 << 20

DTYPES = ["bool",  # and bfloat16: tests/torch/test_torch_interop.py "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", ">i4", ">f8", "S5", "U3", "datetime64[ns]", "timedelta64[s]"]
SHAPES = [(), (0,), (7,), (2, 3, 4), (1, 0, 3)]


def sample(dtype: np.dtype, shape) -> np.ndarray:
    n = int(np.prod(shape))
    raw = np.random.default_rng(n).integers(0, 255, n * dtype.itemsize, dtype=np.uint8)
    if dtype.kind in "mM":
        return np.arange(n, dtype=np.int64).view(dtype).reshape(shape)
    return raw.view(dtype).reshape(shape) if n else np.zeros(shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_shape_twice(rdv, dtype):
    """The first message of a form goes the Python way (and teaches the
    caches), the second the C way: both the same, read-only, and freed."""
    dtype = np.dtype(dtype)
    for shape in SHAPES:
        a = sample(dtype, shape)
        for _ in range(2):
            rdv.send("k", a)
            v = rdv.recv("k", timeout=5)
            assert v.dtype == dtype and v.shape == shape and v.tobytes() == a.tobytes()
            assert not v.flags.writeable
            with pytest.raises(ValueError):
                v.flags.writeable = True  # its base lends no writable buffer
            rdv.send("k", a)
            w = rdv.recv("k", timeout=5, writable=True)
            assert w.flags.writeable and w.tobytes() == a.tobytes()
            if w.size:
                w.reshape(-1)[0] = w.reshape(-1)[-1]  # writable memory
            del v, w
    assert rdv.stats().bytes_used == 0


def test_views_keep_their_block_until_the_last_goes(rdv):
    a = np.arange(1000, dtype=np.float64)
    rdv.send("k", a)
    rdv.send("k", a)  # the second of a form: the C way
    first = rdv.recv("k")
    v = rdv.recv("k")
    assert type(v.base) is _fastpath.Payload
    part = v[10:20]
    del v
    used = rdv.stats().bytes_used
    assert np.array_equal(part, a[10:20])
    del part
    assert rdv.stats().bytes_used < used
    del first
    assert rdv.stats().bytes_used == 0


def test_send_takes_the_python_path_for_what_it_does_not_know(rdv):
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    cases = [base[:, ::2], base.T, np.asfortranarray(base), base.view(type("Sub", (np.ndarray,), {})),
             np.arange(3).astype("datetime64[D]"), [1, 2, 3], np.float32(3.5)]
    for case in cases * 2:
        rdv.send("k", case)
        got = rdv.recv("k", timeout=5)
        assert np.array_equal(got, np.asarray(case)) and got.dtype == np.asarray(case).dtype
        del got
    assert rdv.stats().bytes_used == 0


def test_large_sends_and_a_full_arena(rdv):
    big = np.full(MiB // 4, 7, np.float32)  # over the size sent with the GIL held
    for _ in range(2):
        rdv.send("big", big)
        assert np.array_equal(rdv.recv("big", timeout=5), big)
    held = []
    with pytest.raises(shmrdv.RendezvousTimeout):
        while True:  # fills the 4 MiB arena: the C send finds no room, the Python one waits and times out
            rdv.send("full", big, timeout=0.05)
            held.append(1)
    assert 2 <= len(held) <= 4
    rdv.recv("full", timeout=5)  # received and dropped: room again
    rdv.send("full", big, timeout=5)
    while rdv.stats().pending_messages:
        rdv.recv("full", timeout=5)


def test_recv_that_waits_and_times_out(rdv):
    a = np.arange(4, dtype=np.int16)
    rdv.send("k", a)
    rdv.recv("k")  # the form is known: what follows takes the C path's start
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv("k", timeout=0.05)
    sender = threading.Timer(0.3, rdv.send, ("k", a))
    sender.start()
    try:
        got = rdv.recv("k", timeout=10)  # waits in line past the first slice
    finally:
        sender.join()
    assert np.array_equal(got, a)


def test_interleaved_forms_of_one_size_get_their_own_views(rdv, monkeypatch):
    """send keeps the form it looked up last, and recv the descriptor: arrays
    of the same byte count but another dtype or shape, interleaved, are each
    sent and received as themselves; a new cache starts afresh (the Python
    path builds the form, or parses the descriptor, again)."""
    forms = [np.arange(16, dtype=np.float32).reshape(4, 4), np.arange(16, dtype=np.float32).reshape(2, 8),
             np.arange(16, dtype=np.int32), np.arange(8, dtype=np.float64)]
    for repeat in (1, 2, 1):  # each form once in turn, then each twice in a row
        for a in forms:
            for _ in range(repeat):
                rdv.send("k", a)
        for a in forms:
            for _ in range(repeat):
                v = rdv.recv("k", timeout=5)
                assert v.dtype == a.dtype and v.shape == a.shape and np.array_equal(v, a)
    fresh = {}
    swap_caches(monkeypatch, descs=fresh)
    rdv.send("k", forms[0])
    assert np.array_equal(rdv.recv("k", timeout=5), forms[0])
    assert len(fresh) == 1  # parsed in Python again, not served from the kept one
    fresh_forms = {}
    swap_caches(monkeypatch, fast_forms=fresh_forms, send_forms={})
    rdv.send("k", forms[0])  # the form sent last, but another forms dict: built in Python again
    assert len(fresh_forms) == 1
    rdv.send("k", forms[1])
    assert len(fresh_forms) == 2
    for a in forms[:2]:
        v = rdv.recv("k", timeout=5)
        assert v.shape == a.shape and np.array_equal(v, a)
    assert rdv.stats().pending_messages == 0


class Interrupted(Exception):
    pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay", [0.002, 0.02])  # in recv_key's first slice, and in the Python path's slices after
def test_a_signal_while_waiting_leaves_the_line_and_loses_nothing(rdv, delay):
    """A signal handler that raises while recv waits in C: recv raises it,
    out of line, and the message sent after it is the next recv's."""
    def handler(signum, frame):
        raise Interrupted()

    old = signal.signal(signal.SIGUSR1, handler)
    main = threading.get_ident()
    a = np.arange(8, dtype=np.int64)
    rdv.send("k", a)
    rdv.recv("k")  # the form is known: the waits below start in C
    try:
        for i in range(20):
            t = threading.Timer(delay, signal.pthread_kill, (main, signal.SIGUSR1))
            with pytest.raises(Interrupted):
                t.start()  # on a busy machine the signal may come before start() returns
                rdv.recv("k", timeout=10)
            t.join()
            assert rdv.stats().waiters == 0
            rdv.send("k", a + i)
            assert np.array_equal(rdv.recv("k", timeout=10), a + i)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert rdv.stats().pending_messages == 0


def test_the_hot_paths_are_the_ones_taken(rdv, monkeypatch):
    """After the first message of a form, send and recv run whole in C
    (rendezvous._hot_methods): no Python code of theirs runs, so nothing is
    called through cffi or the fast module, with a timeout of None or
    seconds, as int or float."""
    calls, fast_calls = [], []

    class Counting:
        def __init__(self, real, into):
            self.real, self.into = real, into

        def __getattr__(self, name):
            self.into.append(name)
            return getattr(self.real, name)

    a = np.ones(16, np.float32)
    rdv.send("k", a)
    rdv.recv("k")
    for module in (rendezvous, receiving, forms, waits):  # every module of the Python send and recv
        monkeypatch.setattr(module, "lib", Counting(module.lib, calls))
        if hasattr(module, "fast"):
            monkeypatch.setattr(module, "fast", Counting(module.fast, fast_calls))
    for timeout in (None, 5, 5.0) * 3:
        rdv.send("k", a)
        v = rdv.recv("k", timeout=timeout)
        del v
    monkeypatch.undo()
    assert calls == [] and fast_calls == []
    assert type(type(rdv).send) is type(type(rdv).recv) is _fastpath.Method


@pytest.mark.timeout(60)
def test_recv_key_leaves_every_other_timeout_and_key_to_python(rdv):
    """Timeouts recv_key does not take, keys it has not seen and threads
    with no scratch yet go the Python way: the same messages, the same
    errors, nothing left queued or in line."""
    a = np.arange(5, dtype=np.int16)
    rdv.send("k", a)
    rdv.recv("k")
    for timeout in (0, 0.0, 0.5, 2, float("inf"), 10 ** 40, 1e300):
        rdv.send("k", a)
        assert np.array_equal(rdv.recv("k", timeout=timeout), a)
    for timeout, error in ((True, shmrdv.InvalidType), ("1", shmrdv.InvalidType), (-1, shmrdv.InvalidArgument),
                           (-0.5, shmrdv.InvalidArgument), (float("nan"), shmrdv.InvalidArgument),
                           (-10 ** 40, shmrdv.InvalidArgument)):
        with pytest.raises(error, match="timeout"):
            rdv.recv("k", timeout=timeout)
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv("k", timeout=0)
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv("never-seen-before", timeout=0.01)
    got = []
    rdv.send("k", a)
    thread = threading.Thread(target=lambda: got.append(rdv.recv("k", timeout=5)))  # no scratch there yet
    thread.start()
    thread.join(10)
    assert len(got) == 1 and np.array_equal(got[0], a)
    del got
    stats = rdv.stats()
    assert stats.pending_messages == 0 and stats.waiters == 0


@pytest.mark.timeout(120)
def test_threads_that_wait_at_once_or_come_and_go_each_receive_into_their_own_scratch(rdv):
    """recv's hot path remembers the last thread's scratch and the last
    key's bytes: threads waiting at the same time, and threads that end and
    are replaced (a new one may get the old one's thread state), each
    receive exactly their own key's messages, in order."""
    per = 300

    def receive(key, out):
        for _ in range(per):
            out.append(int(rdv.recv(key, timeout=30)[0]))

    def sends(keys):
        for i in range(per):
            for key in keys:
                rdv.send(key, np.array([i], np.int64))

    keys = [f"thread-{t}" for t in range(4)]
    got = {key: [] for key in keys}
    waiting = [threading.Thread(target=receive, args=(key, got[key])) for key in keys]
    for thread in waiting:
        thread.start()
    sends(keys)
    for thread in waiting:
        thread.join(60)
    assert all(got[key] == list(range(per)) for key in keys)
    for round_ in range(20):  # short-lived threads, one after another, the main thread between them
        key = f"gone-{round_ % 2}"
        out = []
        thread = threading.Thread(target=receive, args=(key, out))
        thread.start()
        sends([key])
        thread.join(60)
        assert out == list(range(per)), round_
        rdv.send("main", np.array([round_], np.int64))
        assert int(rdv.recv("main", timeout=5)[0]) == round_
    stats = rdv.stats()
    assert stats.pending_messages == 0 and stats.waiters == 0


def test_send_key_leaves_every_other_timeout_to_python(rdv):
    """A send the C path could make (key and form sent before) with a
    timeout it does not take goes the Python way: sent, or refused with the
    same error as ever and nothing queued."""
    a = np.arange(5, dtype=np.int16)
    rdv.send("k", a)
    rdv.recv("k")
    for timeout in (0, 0.0, 3, 0.5, float("inf"), 10 ** 40, 1e300):
        rdv.send("k", a, timeout=timeout)
        assert np.array_equal(rdv.recv("k", timeout=5), a)
    for timeout, error in ((True, shmrdv.InvalidType), ("1", shmrdv.InvalidType), (-1, shmrdv.InvalidArgument),
                           (-0.5, shmrdv.InvalidArgument), (float("nan"), shmrdv.InvalidArgument)):
        with pytest.raises(error, match="timeout"):
            rdv.send("k", a, timeout=timeout)
    assert rdv.stats().pending_messages == 0


def test_recv_key_takes_a_message_of_a_new_form_to_python_for_its_view(rdv, monkeypatch):
    """A known key whose next message has a descriptor not seen yet: taken
    in C, its view made in Python."""
    fresh = {}
    swap_caches(monkeypatch, descs=fresh)
    rdv.send("k", np.zeros(3, np.float32))
    rdv.recv("k")
    assert len(fresh) == 1
    new = np.arange(12, dtype=np.uint8).reshape(3, 4)
    rdv.send("k", new)
    v = rdv.recv("k", timeout=5)
    assert v.dtype == new.dtype and v.shape == new.shape and np.array_equal(v, new)
    assert len(fresh) == 2  # parsed in Python
    del v
    assert rdv.stats().bytes_used == 0


def test_recv_many_makes_views_in_c_then_in_python_in_order(rdv, monkeypatch):
    swap_caches(monkeypatch, descs={})
    known = np.arange(3, dtype=np.int32)
    rdv.send("k", known)
    rdv.recv("k")  # this one's descriptor is known from now on
    new = np.arange(15, dtype=np.uint16).reshape(3, 5)
    items = [known, known + 1, new, known + 2, new + 1]
    rdv.send_many([("k", a) for a in items])
    got = rdv.recv_many("k", 10)
    assert len(got) == 5 and all(np.array_equal(g, a) and g.dtype == a.dtype for g, a in zip(got, items))
    assert [type(g.base) for g in got] == [_fastpath.Payload] * 5 and not any(g.flags.writeable for g in got)
    del got
    assert rdv.stats().bytes_used == 0


def test_send_many_in_c_sends_all_or_leaves_the_batch_to_python(rdv):
    a = np.arange(256, dtype=np.float32)  # 1 KiB
    rdv.send_many([("k", a)])  # the kind is known from now on
    rdv.recv("k")
    with pytest.raises(shmrdv.InvalidType, match="item 3, nothing sent"):
        rdv.send_many([("k", a)] * 3 + [("k", object())])  # known kinds, then a bad item: nothing is sent
    assert rdv.stats().pending_messages == 0
    rdv.send_many([("k", a + i) for i in range(5)] + [("other", a[:10])])  # a new kind among known ones
    got = rdv.recv_many("k", 10) + rdv.recv_many("other", 10)
    assert [float(g[0]) for g in got] == [0, 1, 2, 3, 4, 0] and len(got[-1]) == 10
    del got
    small = np.zeros(16 << 10, np.float32)  # 64 KiB
    rdv.send_many([("small", small)])
    rdv.recv("small")
    held = []
    for _ in range(3):  # three of the 4 MiB held, and some more: about half a MiB left
        rdv.send("big", np.zeros(MiB // 4 - 64, np.float32))
        held.append(rdv.recv("big"))
    for _ in range(7):
        rdv.send("small", small)
        held.append(rdv.recv("small"))
    with pytest.raises(shmrdv.RendezvousTimeout) as err:
        rdv.send_many([("small", small)] * 12, timeout=0.05)  # 768 KiB: C sends what fits, Python waits for the rest
    sent = err.value.sent
    assert 0 < sent < 12 and rdv.stats().pending_messages == sent
    assert f"the {sent} item(s) before it were sent" in str(err.value)
    del held
    for _ in range(sent):
        rdv.recv("small", timeout=5)
    assert rdv.stats().bytes_used == 0


def test_send_many_after_a_kind_was_made_again_sends_what_it_says(rdv):
    """A kind made again (a str subclass's key replaces the cached entry of
    the equal str) must not leave the C path an item that is gone."""
    class Key(str):
        pass

    a = np.arange(4, dtype=np.int32)
    rdv.send_many([("k", a)])
    rdv.send_many([(Key("k"), a)])  # makes the kind anew over the cached one
    gc.collect()
    key, code, dims = ffi.new("char[]", b"EVIL"), ffi.new("char[]", b"<u1"), ffi.new("int64_t[]", [16, 1])
    junk = []
    for _ in range(20000):  # items of another key where a freed one lay, if one was freed
        item = ffi.new("struct rdv_send_item *")
        item.key, item.key_len, item.dtype, item.dtype_len = key, 4, code, 3
        item.ndim, item.shape, item.strides, item.nbytes = 1, dims, dims + 1, 16
        junk.append(item)
    rdv.send_many([("k", a + 1)])
    del junk
    got = rdv.recv_many("k", 10)
    assert [g.tolist() for g in got] == [[0, 1, 2, 3]] * 2 + [[1, 2, 3, 4]] and all(g.dtype == np.int32 for g in got)
    assert rdv.stats().keys == 0 and rdv.stats().pending_messages == 0  # no message went to another key


def test_send_and_recv_are_methods_as_python_would_make_them(rdv):
    """Rendezvous.send and .recv are C method descriptors (fast.Method): bound
    and unbound calls, keywords, help() and inspect see the Python methods
    they wrap, and a call the hot path does not take (keywords by name, a
    bad argument) gets what the Python method does."""
    import inspect

    cls = type(rdv)
    for name in ("send", "recv"):
        method = getattr(cls, name)
        assert type(method) is _fastpath.Method and method.__wrapped__.__name__ == name
        assert method.__name__ == name and method.__qualname__ == f"Rendezvous.{name}"
        assert method.__doc__ == method.__wrapped__.__doc__ and "key" in method.__doc__
        assert inspect.signature(method) == inspect.signature(method.__wrapped__)
        assert inspect.signature(getattr(rdv, name)) == inspect.signature(method.__wrapped__.__get__(rdv))
        assert getattr(rdv, name).__self__ is rdv
    a = np.arange(6, dtype=np.int32)
    cls.send(rdv, "k", a)  # unbound, the hot path's form once known
    bound = rdv.send
    bound("k", a, timeout=1)
    rdv.send(key="k", array=a, timeout=2.5)  # by name: the Python method
    assert np.array_equal(cls.recv(rdv, "k"), a)
    assert np.array_equal(rdv.recv("k", timeout=1, lease=False, writable=True), a)
    assert np.array_equal(rdv.recv(key="k"), a)
    with pytest.raises(TypeError, match="timeot"):
        rdv.send("k", a, timeot=1)
    with pytest.raises(TypeError, match="as_tensor"):
        rdv.recv("k", as_tensor=True)
    with pytest.raises(TypeError):
        rdv.recv()
    with pytest.raises(TypeError):
        cls.send("k", a)  # no rendezvous: the Python method says what is missing
    assert rdv.stats().pending_messages == 0


def test_a_subclass_takes_the_hot_path_and_a_closed_handle_the_python_way(rdv_name):
    """The hot path reads the handle's fields as the Python code leaves them:
    a subclass's calls take it too, a closed handle raises the Python
    method's error, and a handle closed while a view is out keeps that view."""
    class Mine(shmrdv.Rendezvous):
        pass

    r = Mine(rdv_name, create=True)
    try:
        a = np.arange(4, dtype=np.float64)
        for _ in range(3):
            r.send("k", a)
            v = r.recv("k", timeout=5)
            assert np.array_equal(v, a)
        r.send("k", a)
        r.close()
        assert np.array_equal(v, a)  # a view outlives its handle
        with pytest.raises(shmrdv.RendezvousError, match="closed"):
            r.send("k", a)
        with pytest.raises(shmrdv.RendezvousError, match="closed"):
            r.recv("k", timeout=1)
        del v
    finally:
        r.close()
        r.unlink()


def test_the_methods_pickle_by_name_as_the_python_ones_did():
    import pickle

    for method in (shmrdv.Rendezvous.send, shmrdv.Rendezvous.recv):
        assert pickle.loads(pickle.dumps(method)) is method


@pytest.mark.timeout(60)
def test_a_handle_closed_while_a_receive_waits_in_c_raises_closed_and_leaves_the_line(rdv_name):
    """Another thread closes the handle during recv's first slice in C: the
    receive goes on with the handle it started with, raises RendezvousError
    (not a TypeError from a None handle), and is out of line."""
    a = np.arange(3, dtype=np.int32)
    for attempt in range(5):
        r = shmrdv.Rendezvous(rdv_name, create=attempt == 0)
        r.send("k", a)
        r.recv("k")  # known: the next recv waits in C
        errors = []

        def receive():
            try:
                r.recv("k", timeout=5)
            except BaseException as exc:  # noqa: B902 - the type is what is checked
                errors.append(exc)

        t = threading.Thread(target=receive)
        t.start()
        time.sleep(0.003)
        r.close()
        t.join(30)
        assert not t.is_alive() and len(errors) == 1
        assert isinstance(errors[0], shmrdv.RendezvousError), repr(errors[0])
        with shmrdv.Rendezvous(rdv_name, create=False) as again:
            assert again.stats().waiters == 0
            again.send("k", a)  # a message sent now is there for the next receiver
            assert np.array_equal(again.recv("k", timeout=5), a)
    shmrdv.Rendezvous(rdv_name, create=False).unlink()


@pytest.mark.parametrize("where", ["in line", "a message taken"])
def test_an_exception_as_recv_goes_on_in_python_leaves_the_line_and_loses_nothing(rdv, monkeypatch, where):
    """What a signal handler does when it runs as _recv_went_on is entered,
    before its first line: the hot path itself leaves the line, or gives back
    the message it took, then raises the exception."""
    a = np.arange(5, dtype=np.int16)
    rdv.send("k", a)
    rdv.recv("k")  # the key is known: recv starts in C

    def interrupted(*args):
        raise Interrupted()

    monkeypatch.setattr(type(rdv), "_recv_went_on", interrupted)
    new_form = np.arange(6, dtype=np.float32).reshape(2, 3)
    if where == "a message taken":
        swap_caches(monkeypatch, descs={})  # its descriptor is new: taken in C, viewed in Python
        rdv.send("k", new_form)
    with pytest.raises(Interrupted):
        rdv.recv("k", timeout=1)  # in line after the first slice, or taken at once
    monkeypatch.undo()
    assert rdv.stats().waiters == 0
    if where == "a message taken":
        assert rdv.stats().pending_messages == 1  # given back to its key
        got = rdv.recv("k", timeout=5)
        assert got.shape == (2, 3) and np.array_equal(got, new_form)
        del got
    rdv.send("k", a)
    assert np.array_equal(rdv.recv("k", timeout=5), a)
    assert rdv.stats().bytes_used == 0


# Run in a process of one thread, where recv's hot path waits with the GIL
# held for its first few microseconds (_fastpath.c, GIL_HELD_WAIT_NS), then
# lets it go: every promise of recv holds on either side of that point.
ONE_THREAD_CHILD = r"""
import os, signal, sys, threading, time
import numpy as np
import shmrdv
from shmrdv import _fastpath

name = sys.argv[1]
assert threading.active_count() == 1
rdv = shmrdv.Rendezvous(name, create=True, size=1 << 20)
a = np.arange(16, dtype=np.float32)
rdv.send("k", a); rdv.recv("k")  # the form is known: the receives below start in C

start = time.monotonic()
try:
    rdv.recv("k", timeout=0.05)
    raise AssertionError("no message, and no timeout")
except shmrdv.RendezvousTimeout:
    pass
waited = time.monotonic() - start
assert 0.05 <= waited < 2, waited
assert rdv.stats().waiters == 0

peer = os.fork()
if peer == 0:  # echoes n round trips (answers within microseconds), then sends two late ones
    code = 1
    try:
        with shmrdv.Rendezvous(name, create=False) as mine:
            for _ in range(2000):
                mine.send("up", mine.recv("down", timeout=30) + 1)
            time.sleep(0.02)
            mine.send("up", a * 3)
            time.sleep(0.3)
            mine.send("up", a * 4)
        code = 0
    finally:
        os._exit(code)
waits, served = _fastpath.gil_held_waits()
total = 0.0
for i in range(2000):
    rdv.send("down", a + i)
    total += float(rdv.recv("up", timeout=30).sum())
assert total == sum(float((a + i + 1).sum()) for i in range(2000)), total
now_waits, now_served = _fastpath.gil_held_waits()
assert now_waits - waits == 2000 and now_served > served, (waits, served, now_waits, now_served)
assert np.array_equal(rdv.recv("up", timeout=30), a * 3)  # past the GIL-held wait, within the first slice
assert np.array_equal(rdv.recv("up", timeout=30), a * 4)  # past the first slice
assert os.waitpid(peer, 0)[1] == 0

class Interrupted(Exception):
    pass

def handler(signum, frame):
    raise Interrupted()

signal.signal(signal.SIGALRM, handler)
for delay in (0.000002, 0.00005, 0.02):  # within the GIL-held wait, after it, in a later slice
    try:
        signal.setitimer(signal.ITIMER_REAL, delay)  # inside: it may go off before recv starts
        rdv.recv("k", timeout=10)
        raise AssertionError("the handler did not raise")
    except Interrupted:
        pass
    assert rdv.stats().waiters == 0
    rdv.send("k", a + delay)
    assert np.array_equal(rdv.recv("k", timeout=10), a + delay)
assert rdv.stats().pending_messages == 0
assert threading.active_count() == 1

# With a second thread the GIL is let go at once, as before.
stop = threading.Event()
other = threading.Thread(target=stop.wait)
other.start()
waits = _fastpath.gil_held_waits()[0]
try:
    rdv.recv("k", timeout=0.01)
    raise AssertionError("no message, and no timeout")
except shmrdv.RendezvousTimeout:
    pass
assert _fastpath.gil_held_waits()[0] == waits
stop.set()
other.join()
rdv.close()
print("ok")
"""


@pytest.mark.timeout(120)
def test_a_process_of_one_thread_keeps_every_promise_of_recv(rdv_name):
    """recv in a process of one thread (its wait starts with the GIL held):
    the held wait is taken, and serves answers that come at once; a
    timeout waits its whole length; answers after a moment and after the
    first slice are received, in order and summed right; a signal handler
    that raises at any point of the wait leaves the line and loses
    nothing; with a second thread the GIL is let go at once."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", ONE_THREAD_CHILD, rdv_name], capture_output=True, text=True,
                         timeout=100)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_alloc_of_a_known_form_reserves_in_c_and_sends_what_was_written(rdv, monkeypatch):
    """The first alloc of a (dtype, shape) goes the Python way and teaches
    the form; the next ones reserve in C: same arrays (writable, over the
    segment), same messages, nothing left reserved."""
    swap_caches(monkeypatch, send_forms={}, fast_forms={})
    calls = []
    real = _fastpath.alloc_view
    monkeypatch.setattr(allocation.fast, "alloc_view", lambda *a: calls.append(a[2]) or real(*a), raising=False)
    for dtype, shape in [("float32", (3,)), (">i2", (2, 2)), ("complex128", ()), ("uint8", (0,))]:
        for i in range(3):
            with rdv.alloc("k", shape, dtype) as buf:
                assert buf.flags.writeable and buf.dtype == np.dtype(dtype) and buf.shape == shape
                buf[...] = i
                assert (type(buf.base) is _fastpath.Reserved) == (i > 0)
            got = rdv.recv("k")
            assert got.dtype == np.dtype(dtype) and got.shape == shape and np.all(got == i)
            del got, buf
    assert len(calls) == 8  # two of each form in C
    assert rdv.stats().bytes_used == 0


def test_alloc_in_c_with_no_room_waits_the_python_way_and_an_exception_frees_the_block(rdv_name):
    with shmrdv.Rendezvous(rdv_name, create=True, size=64 << 10) as small:
        try:
            with small.alloc("k", (1000,), np.float64) as buf:  # the form, taught
                buf[:] = 1
            del buf
            small.recv("k")
            held = []
            while True:  # fill the arena with views of the form, each reserved in C
                try:
                    with small.alloc("k", (1000,), np.float64, timeout=0) as buf:
                        buf[:] = 2
                except shmrdv.RendezvousTimeout as exc:
                    assert "alloc 'k'" in str(exc)
                    break
                held.append(small.recv("k"))
            assert held and all(type(v.base) is not type(None) for v in held)
            with pytest.raises(shmrdv.RendezvousTimeout):
                with small.alloc("k", (1000,), np.float64, timeout=0.05):
                    pass
            held.pop()
            with pytest.raises(ZeroDivisionError):
                with small.alloc("k", (1000,), np.float64, timeout=1) as buf:
                    assert type(buf.base) is _fastpath.Reserved
                    1 / 0
            assert small.stats().pending_messages == 0
            del held, buf
            assert small.stats().bytes_used == 0
        finally:
            small.unlink()


def test_an_array_alloc_made_in_c_keeps_the_segment_mapped_after_close(rdv_name):
    rdv = shmrdv.Rendezvous(rdv_name, create=True, size=1 << 20)
    try:
        for i in range(2):
            with rdv.alloc("k", (4,), np.int32) as buf:
                buf[:] = 7
        assert type(buf.base) is _fastpath.Reserved
        rdv.close()
        assert buf.sum() == 28  # still mapped: the array holds the handle
        del buf
        gc.collect()
    finally:
        shmrdv.Rendezvous(rdv_name, create=False).unlink()


@pytest.mark.parametrize("shape, words", [((2.0,), "shape"), ((True, 2), "shape"), ([2, "x"], "shape")])
def test_alloc_checks_every_shape_it_did_not_see_as_ints(rdv, shape, words):
    """alloc remembers what a (dtype, shape) of ints gave; an equal shape of
    other types (2.0 == 2, True == 1) is still checked, and so is a dtype
    argument it cannot remember."""
    with rdv.alloc("k", (2,), np.float32):
        pass
    with rdv.alloc("k", (1, 2), np.float32):
        pass
    with pytest.raises((shmrdv.InvalidArgument, shmrdv.InvalidType), match=words):
        rdv.alloc("k", shape, np.float32)
    for _ in range(2):  # an unhashable dtype argument (a structured dtype's list): checked each time
        with pytest.raises(shmrdv.InvalidType, match="cannot be sent"):
            rdv.alloc("s", (2,), [("a", "<i4"), ("b", "<f8")])


def _mapped(name: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(segments.SEGMENT_PREFIX + name) for line in maps)


def test_alloc_view_that_can_make_no_array_gives_the_block_and_the_mapping_back(rdv_name):
    """A reservation whose array cannot be made (here a shape numpy
    refuses) frees the block, and holds no reference that would keep the
    segment mapped once the Rendezvous is closed."""
    from shmrdv.codec import key_bytes

    rdv = shmrdv.Rendezvous(rdv_name, create=True, size=1 << 20)
    try:
        with rdv.alloc("k", (4,), np.float32):
            pass  # the form, taught
        rdv.recv("k")  # taken and dropped
        form = forms.fast_forms[(np.dtype(np.float32), (4,))]
        for _ in range(3):
            with pytest.raises(ValueError):
                _fastpath.alloc_view(rdv._h_addr, key_bytes("k"), form, np.dtype(np.float32), (-1,))
        assert rdv.stats().bytes_used == 0 and rdv.stats().pending_messages == 0
        assert _mapped(rdv_name)
        rdv.close()
        gc.collect()
        assert not _mapped(rdv_name)
    finally:
        rdv.close()
        shmrdv.Rendezvous(rdv_name, create=False).unlink()


def test_numpy_numbers_are_timeouts_too(rdv):
    """np.float64 is a float, np.int64 is no int: both are seconds, as are
    other numpy numbers, on the C path and the Python one; a huge one waits
    forever (no int64 overflow)."""
    from shmrdv.codec import timeout_ns

    assert timeout_ns(np.int64(2)) == timeout_ns(np.float32(2)) == timeout_ns(2) == 2_000_000_000
    assert timeout_ns(np.int64(10**18)) == timeout_ns(np.uint64(2**63)) == -1
    a = np.ones(4, np.float32)
    for timeout in (np.int64(5), np.float32(5.0), np.uint8(5), np.float64(5.0)):
        rdv.send("k", a, timeout=timeout)
        assert np.array_equal(rdv.recv("k", timeout=timeout), a)
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv("k", timeout=np.int64(0))
    with pytest.raises(shmrdv.InvalidArgument, match="timeout"):
        rdv.recv("k", timeout=np.int64(-1))
    from fractions import Fraction

    with pytest.raises(shmrdv.RendezvousTimeout, match="nothing came within 0.05 s"):  # any real number
        rdv.recv("k", timeout=Fraction(1, 20))
