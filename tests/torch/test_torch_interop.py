"""CPU torch tensors through the core: send, alloc and the collectives take
them (every dtype numpy has, bfloat16, tensors that require grad,
non-contiguous ones, 0-d and empty), and recv(..., as_torch=True) /
shmrdv.torch.recv give tensors over the received shared memory, without a
warning; across processes (a spawned child) and in one; the errors for
tensors shmrdv cannot move and for bad arguments."""
import asyncio
import os
import sys
import traceback
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import shmrdv  # noqa: E402
import shmrdv.torch  # noqa: E402
from shmrdv import codec, rendezvous, tensors  # noqa: E402

from ..conftest import _new_name, _remove_segment, swap_caches  # noqa: E402

QUEUE_TIMEOUT = 60.0  # a spawned child imports torch first: seconds on a busy machine

# Every torch dtype with a numpy counterpart, and bfloat16 (ml_dtypes' on the numpy side).
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bfloat16]
DTYPES += [d for d in (getattr(torch, n, None) for n in ("uint16", "uint32", "uint64")) if d is not None]
NUMPY_OF = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
            torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32,
            torch.float64: np.float64, torch.complex64: np.complex64, torch.complex128: np.complex128,
            torch.bfloat16: ml_dtypes.bfloat16}
for _n in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _n):
        NUMPY_OF[getattr(torch, _n)] = getattr(np, _n)


def name_of(dtype) -> str:
    return str(dtype).replace("torch.", "")


def sample(dtype, shape, seed):
    """A tensor of dtype and shape with random bits (0 or 1 for bool; NaNs and
    infinities included for the floating types: compared by their bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    raw = np.random.default_rng(seed).integers(0, 256, n * itemsize, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


def raw(t) -> bytes:
    """The bytes of a tensor's values, in C order."""
    if t.numel() == 0:
        return b""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def variants(dtype, seed):
    """(what, tensor) pairs: the layouts a sender may hand over."""
    base = sample(dtype, (6, 8), seed)
    out = [("contiguous", base), ("transposed", base.t()), ("strided", base[1::2, ::3]),
           ("0-d", sample(dtype, (), seed + 1)), ("empty", sample(dtype, (0, 5), seed + 2))]
    if dtype.is_floating_point or dtype.is_complex:
        out.append(("requires_grad", base.clone().requires_grad_(True)))
        out.append(("requires_grad-view", (base.clone().requires_grad_(True) * 1)[:, 1::2]))
    return out


def cases():
    """Every (key, tensor) a round trip covers."""
    out = []
    for i, dtype in enumerate(DTYPES):
        for what, t in variants(dtype, seed=100 * i):
            out.append((f"{name_of(dtype)}/{what}", t))
    return out


def assert_same(received, sent):
    assert isinstance(received, torch.Tensor)
    assert received.dtype == sent.dtype
    assert received.shape == sent.shape
    assert received.is_contiguous()
    assert not received.requires_grad
    assert raw(received) == raw(sent)


def views_held(rdv) -> int:
    """Views (received messages still alive) this process holds on rdv."""
    return next(p.views for p in rdv.processes() if p.pid == os.getpid())


@pytest.fixture
def no_warnings():
    """Any warning in the test fails it (torch warns about read-only arrays)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# ---- the child: receives every case as a tensor, writes into it, sends it back ----


def echo_child(name, keys, queue):
    """Receive each key as a tensor (shmrdv.torch.recv), report it, write into
    it and send it back (a tensor send) under key + "/back"; then take the
    key "leased" leased and writable, write 7s into it and exit holding it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rdv = shmrdv.Rendezvous(name, create=False)
            report = []
            for key in keys:
                t = shmrdv.torch.recv(rdv, key, timeout=30)
                report.append((key, str(t.dtype), tuple(t.shape), t.is_contiguous(), raw(t)))
                t.fill_(1)  # in place, in shared memory: the message is ours alone
                rdv.send(key + "/back", t, timeout=30)
                del t
            leased = shmrdv.torch.recv(rdv, "leased", timeout=30, lease=True, writable=True)
            leased.fill_(7)
            queue.put(("ok", report))
            queue.close()
            queue.join_thread()  # flushed before the exit below, which skips every cleanup
        os._exit(0)  # dies holding the leased tensor: the message goes back with the 7s
    except BaseException:
        queue.put(("error", traceback.format_exc()))
        raise


@pytest.mark.timeout(180)
def test_every_dtype_and_layout_across_processes(rdv, children, no_warnings):
    sent = cases()
    keys = [key for key, _ in sent]
    for key, t in sent:
        rdv.send(key, t, timeout=10)
    rdv.send("leased", torch.zeros(4, dtype=torch.bfloat16), timeout=10)
    before = {key: raw(t) for key, t in sent}
    queue = children.context.Queue()
    children.start(echo_child, rdv.name, keys, queue)
    status, report = queue.get(timeout=QUEUE_TIMEOUT)
    assert status == "ok", report
    children.join()
    assert [r[0] for r in report] == keys
    for (key, t), (_, dtype, shape, contiguous, data) in zip(sent, report):
        assert (dtype, shape, contiguous) == (str(t.dtype), tuple(t.shape), True), key
        assert data == raw(t), key
        back = rdv.recv(key + "/back", timeout=10, as_torch=True)
        assert back.dtype == t.dtype and back.shape == t.shape, key
        assert raw(back) == raw(torch.ones_like(t.detach())), key  # what the child wrote
        assert raw(t) == before[key], key  # the sender's tensor is untouched
    # The leased message came back, with what its dead receiver wrote into it.
    assert rdv.collect_garbage() == 1
    leased = shmrdv.torch.recv(rdv, "leased", timeout=10)
    assert leased.dtype == torch.bfloat16 and torch.equal(leased, torch.full((4,), 7, dtype=torch.bfloat16))


def bf16_rank(name, queue):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with shmrdv.Group(name, 1, 2, timeout=30) as g:
                x = torch.full((5, 3), 2.5, dtype=torch.bfloat16, requires_grad=True)
                total = g.allreduce(x)
                gathered = g.allgather(x[:, 1:])  # non-contiguous
                queue.put(("ok", str(total.dtype), total.tolist(), str(gathered.dtype), gathered.tolist()))
    except BaseException:
        queue.put(("error", traceback.format_exc()))
        raise


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bfloat16_collectives_across_processes(children, no_warnings):
    name = _new_name()
    try:
        queue = children.context.Queue()
        children.start(bf16_rank, name, queue)
        with shmrdv.Group(name, 0, 2, timeout=QUEUE_TIMEOUT) as g:
            x = torch.full((5, 3), 1.0, dtype=torch.bfloat16)
            total = g.allreduce(x)
            gathered = g.allgather(x[:, 1:])
        reply = queue.get(timeout=QUEUE_TIMEOUT)
        assert reply[0] == "ok", reply
        children.join()
        assert isinstance(total, torch.Tensor) and total.dtype == torch.bfloat16
        assert torch.equal(total, torch.full((5, 3), 3.5, dtype=torch.bfloat16))
        assert reply[1:3] == ("torch.bfloat16", total.tolist())
        assert gathered.dtype == torch.bfloat16 and gathered.shape == (2, 5, 2)
        assert gathered[0].eq(1).all() and gathered[1].eq(2.5).all()
        assert reply[3:] == ("torch.bfloat16", gathered.tolist())
    finally:
        _remove_segment(name)


EVERY_PATH = """
import asyncio, sys, warnings
import torch, shmrdv, shmrdv.torch
warnings.simplefilter("error")
x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
with shmrdv.Rendezvous() as rdv:
    def sent(key, t=x):
        rdv.send(key, t)
        return key
    got = [rdv.recv(sent("a"), as_torch=True), rdv.try_recv(sent("b"), as_torch=True),
           rdv.recv_any([sent("c")], as_torch=True)[1], rdv.recv(sent("d"), lease=True, as_torch=True),
           shmrdv.torch.recv(rdv, sent("e")), shmrdv.torch.recv(rdv, sent("f"), lease=True),
           rdv.recv(sent("g", x.to(torch.bfloat16)), as_torch=True)]
    fut = rdv.recv_async("h", as_torch=True)
    got.append(fut.result(timeout=5) if sent("h") else None)
    got.append(asyncio.run(rdv.arecv(sent("i"), as_torch=True)))
    got.append(asyncio.run(rdv.arecv_any([sent("j")], as_torch=True))[1])
    with rdv.alloc("k", (2, 3), torch.float32) as buf:
        buf.copy_(x)
    got.append(rdv.recv("k", as_torch=True))
    with shmrdv.Group(rdv.name, 0, 1) as g:
        got.append(g.allreduce(x.to(torch.bfloat16)).float())
    assert all(torch.equal(t.float(), x) for t in got), got
    del got
print("ok")
"""


@pytest.mark.timeout(120)
def test_no_receive_path_warns_in_a_fresh_process():
    # torch warns once per process about read-only arrays: only a fresh one shows whether any path would.
    import subprocess

    out = subprocess.run([sys.executable, "-W", "error", "-c", EVERY_PATH], capture_output=True, text=True,
                         timeout=100)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "ok", "")


# ---- in one process ----


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", DTYPES, ids=name_of)
def test_round_trip_in_process(rdv, dtype, no_warnings):
    for what, t in variants(dtype, seed=7):
        rdv.send(what, t, timeout=5)
        assert_same(rdv.recv(what, timeout=5, as_torch=True), t)
        rdv.send(what, t, timeout=5)
        assert_same(shmrdv.torch.recv(rdv, what, timeout=5), t)
        rdv.send(what, t, timeout=5)
        array = rdv.recv(what, timeout=5)  # as an array: numpy's counterpart (ml_dtypes' bfloat16)
        assert array.dtype == np.dtype(NUMPY_OF[dtype]) and array.shape == tuple(t.shape)
        assert not array.flags.writeable
        assert array.tobytes() == raw(t)


@pytest.mark.timeout(60)
def test_bfloat16_has_its_own_code_and_round_trips_as_numpy(rdv):
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert bf16.str == "<V2" and codec.dtype_code(bf16) == codec.BF16_CODE == b"bfloat16"
    assert codec.dtype_sendable(bf16) and codec.dtype_of(b"bfloat16") == bf16
    assert not codec.dtype_sendable(np.dtype("V2"))  # other void dtypes stay refused
    with pytest.raises(shmrdv.InvalidType):
        rdv.send("void", np.zeros(2, "V2"))
    x = np.array([[1.5, -2.25], [3e38, float("nan")]], dtype=bf16)
    rdv.send("bf", x, timeout=5)
    got = rdv.recv("bf", timeout=5)
    assert got.dtype == bf16 and got.tobytes() == x.tobytes()
    rdv.send("bf", x.T, timeout=5)  # non-contiguous: one copy
    assert rdv.recv("bf", timeout=5).tobytes() == np.ascontiguousarray(x.T).tobytes()


@pytest.mark.timeout(60)
def test_a_received_tensor_shares_the_message_and_is_writable(rdv, no_warnings):
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rdv.send("w", sent, timeout=5)
    got = rdv.recv("w", timeout=5, as_torch=True)
    assert views_held(rdv) == 1  # the tensor is the view: no copy
    got.mul_(10)  # the message is this receiver's alone
    assert torch.equal(got, torch.arange(12, dtype=torch.float32).reshape(3, 4) * 10)
    assert torch.equal(sent, torch.arange(12, dtype=torch.float32).reshape(3, 4))  # the sender's is untouched
    alias = got[1]  # a view of it keeps the message alive too
    del got
    assert views_held(rdv) == 1 and torch.equal(alias, torch.arange(4, 8, dtype=torch.float32) * 10)
    del alias
    assert views_held(rdv) == 0
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_leased_tensors(rdv, no_warnings):
    rdv.send("l", torch.ones(3), timeout=5)
    got = shmrdv.torch.recv(rdv, "l", timeout=5, lease=True)  # read-only by contract (torch cannot enforce it)
    assert torch.equal(got, torch.ones(3)) and views_held(rdv) == 1
    del got
    assert views_held(rdv) == 0 and rdv.try_recv("l") is None  # released: freed as without a lease
    rdv.send("l", torch.ones(3, dtype=torch.bfloat16), timeout=5)
    got = rdv.recv("l", timeout=5, lease=True, writable=True, as_torch=True)
    got.add_(1)
    assert torch.equal(got, torch.full((3,), 2, dtype=torch.bfloat16))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64, torch.complex128],
                         ids=name_of)
def test_alloc_with_a_torch_dtype_gives_a_tensor(rdv, dtype, no_warnings):
    with rdv.alloc("a", (2, 3), dtype, timeout=5) as buf:
        assert isinstance(buf, torch.Tensor) and buf.dtype == dtype and buf.shape == (2, 3)
        buf.fill_(1)
    got = rdv.recv("a", timeout=5, as_torch=True)
    assert got.dtype == dtype and torch.equal(got, torch.ones(2, 3, dtype=dtype))
    with rdv.alloc("a", (), dtype, timeout=5) as buf:  # 0-d
        buf.fill_(0)
    assert rdv.recv("a", timeout=5).shape == ()
    with rdv.alloc("a", 4, np.float32, timeout=5) as buf:  # a numpy dtype still gives an array
        assert isinstance(buf, np.ndarray)
        buf[:] = 1
    assert isinstance(rdv.recv("a", timeout=5), np.ndarray)


@pytest.mark.timeout(60)
def test_alloc_open_publish_and_discard_with_a_tensor(rdv):
    alloc = rdv.alloc("p", 3, torch.bfloat16, timeout=5)
    buf = alloc.open()
    buf.fill_(4)
    alloc.publish()
    assert torch.equal(rdv.recv("p", timeout=5, as_torch=True), torch.full((3,), 4, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError), rdv.alloc("p", 3, torch.float32, timeout=5) as buf:
        raise RuntimeError("abandoned")
    assert rdv.try_recv("p") is None


@pytest.mark.timeout(60)
def test_recv_any_try_recv_and_async_as_torch(rdv, no_warnings):
    rdv.send("b", torch.full((2,), 3, dtype=torch.bfloat16), timeout=5)
    key, got = rdv.recv_any(["a", "b"], timeout=5, as_torch=True)
    assert key == "b" and got.dtype == torch.bfloat16 and torch.equal(got, torch.full((2,), 3, dtype=torch.bfloat16))
    got.fill_(0)  # writable: the message is this receiver's alone
    assert rdv.try_recv("a", as_torch=True) is None
    rdv.send("a", torch.arange(3), timeout=5)
    got = rdv.try_recv("a", as_torch=True)
    assert torch.equal(got, torch.arange(3))
    fut = rdv.recv_async("f", as_torch=True)
    rdv.send("f", torch.ones(2, dtype=torch.complex64), timeout=5)
    assert torch.equal(fut.result(timeout=5), torch.ones(2, dtype=torch.complex64))
    assert fut.result(timeout=5) is fut.result(timeout=5)

    async def main():
        rdv.send("c", torch.ones(4, dtype=torch.float16), timeout=5)
        one = await rdv.arecv("c", timeout=5, as_torch=True)
        rdv.send("d", torch.zeros((), dtype=torch.bfloat16), timeout=5)
        key, two = await rdv.arecv_any(["c", "d"], timeout=5, as_torch=True)
        return one, key, two

    one, key, two = asyncio.run(main())
    assert torch.equal(one, torch.ones(4, dtype=torch.float16))
    assert key == "d" and two.dtype == torch.bfloat16 and two.shape == ()


@pytest.mark.timeout(60)
def test_asend_and_a_collective_take_tensors(rdv_name, no_warnings):
    with shmrdv.Rendezvous() as rdv:
        x = torch.linspace(0, 1, 6, dtype=torch.bfloat16).reshape(2, 3)
        asyncio.run(rdv.asend("s", x.t(), timeout=5))
        assert torch.equal(rdv.recv("s", timeout=5, as_torch=True), x.t())
    with shmrdv.Group(rdv_name, 0, 1, timeout=10) as g:
        out = g.allreduce(x.requires_grad_(True))
        assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and torch.equal(out, x.detach())
        assert g.broadcast(x.detach().t()).dtype == torch.bfloat16


@pytest.mark.timeout(60)
def test_the_sender_keeps_its_tensor_and_its_grad(rdv):
    w = torch.randn(4, requires_grad=True)
    loss = (w * 2).sum()
    rdv.send("w", w, timeout=5)  # its data: no graph, no error about requires_grad
    loss.backward()
    assert torch.equal(w.grad, torch.full((4,), 2.0))
    got = rdv.recv("w", timeout=5, as_torch=True)
    assert not got.requires_grad and torch.equal(got, w.detach())


# ---- errors ----


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make, words", [
    (lambda: torch.empty(3, device="meta"), ["meta tensor holds no data"]),
    (lambda: torch.zeros(3, dtype=torch.complex32), ["complex32", "no numpy counterpart", "t.to(torch.complex64)"]),
    (lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), ["nested tensor", "t.unbind()"]),
    (lambda: torch.zeros(3, dtype=torch.float8_e4m3fn), ["float8_e4m3fn", "no numpy counterpart"]),
    (lambda: torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8), ["quantized", "dequantize()"]),
    (lambda: torch.eye(3).to_sparse(), ["sparse", ".to_dense()"]),
], ids=["meta-device", "complex32", "nested", "float8", "quantized", "sparse"])
def test_tensors_shmrdv_cannot_move_raise_invalid_type(rdv, make, words):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own, about complex32 and quantized tensors
        t = make()
    for send in (lambda: rdv.send("bad", t), lambda: asyncio.run(rdv.asend("bad", t))):
        with pytest.raises(shmrdv.InvalidType) as err:
            send()
        for word in words:
            assert word in str(err.value)
    assert rdv.stats().pending_messages == 0


@pytest.mark.timeout(60)
def test_alloc_with_a_torch_dtype_numpy_lacks(rdv):
    for dtype in (torch.complex32, torch.float8_e5m2, torch.qint8):
        with pytest.raises(shmrdv.InvalidType, match="no numpy counterpart"):
            rdv.alloc("bad", 3, dtype)
    with pytest.raises(shmrdv.InvalidType, match="bad dtype"):
        rdv.alloc("bad", 3, "not a dtype")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad", [1, 0, "yes", None, torch.float32])
def test_a_bad_as_torch_argument_takes_nothing(rdv, bad):
    rdv.send("k", np.ones(2), timeout=5)
    calls = [lambda: rdv.recv("k", timeout=1, as_torch=bad), lambda: rdv.try_recv("k", as_torch=bad),
             lambda: rdv.recv_any(["k"], timeout=1, as_torch=bad), lambda: rdv.recv_async("k", as_torch=bad),
             lambda: asyncio.run(rdv.arecv("k", timeout=1, as_torch=bad)),
             lambda: asyncio.run(rdv.arecv_any(["k"], timeout=1, as_torch=bad))]
    for call in calls:
        with pytest.raises(shmrdv.InvalidType, match="as_torch must be True or False"):
            call()
    assert rdv.stats().pending_messages == 1 and rdv.stats().waiters == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("array", [np.array(["2021-01-01"], "M8[ns]"), np.array(["ab"]), np.arange(3, dtype=">i4")],
                         ids=["datetime", "string", "big-endian"])
def test_a_message_torch_cannot_hold_stays_queued(rdv, array):
    rdv.send("k", array, timeout=5)
    rdv.send("k", np.ones(1), timeout=5)  # behind it
    for receive in (lambda: rdv.recv("k", timeout=5, as_torch=True),
                    lambda: rdv.recv_any(["k"], timeout=5, as_torch=True),
                    lambda: rdv.recv_async("k", as_torch=True).result(timeout=5)):
        with pytest.raises(shmrdv.InvalidType, match="as_torch=False"):
            receive()
        assert rdv.stats().pending_messages == 2 and views_held(rdv) == 0
    got = rdv.recv("k", timeout=5)  # as an array: the same message, first in line still
    assert got.dtype == array.dtype and got.tobytes() == array.tobytes()


@pytest.fixture
def without_ml_dtypes(monkeypatch):
    """This process as one where ml_dtypes is not installed."""
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # its import raises ImportError
    for module, cache in ((tensors, "_numpy_dtypes"), (codec, "_code_dtypes")):
        monkeypatch.setattr(module, cache, {})  # what they learnt of bfloat16 so far
    swap_caches(monkeypatch, descs={})
    monkeypatch.setattr(tensors, "_bfloat16", None)
    from shmrdv.bridge import protocol

    monkeypatch.setattr(protocol, "_dtypes", {})
    return monkeypatch


@pytest.mark.timeout(60)
def test_bfloat16_without_ml_dtypes_says_what_to_install(rdv, request):
    rdv.send("bf", torch.ones(3, dtype=torch.bfloat16), timeout=5)
    patched = request.getfixturevalue("without_ml_dtypes")
    with pytest.raises(shmrdv.InvalidType, match="pip install ml_dtypes"):
        rdv.send("bf", torch.ones(3, dtype=torch.bfloat16))
    with pytest.raises(shmrdv.InvalidType, match="pip install ml_dtypes"):
        rdv.alloc("bf", 3, torch.bfloat16)
    for receive in (lambda: rdv.recv("bf", timeout=5), lambda: rdv.recv("bf", timeout=5, as_torch=True),
                    lambda: rdv.recv_async("bf").result(timeout=5)):
        with pytest.raises(shmrdv.InvalidType, match="pip install ml_dtypes"):
            receive()
        assert rdv.stats().pending_messages == 1 and views_held(rdv) == 0  # it stays queued
    patched.undo()
    assert torch.equal(rdv.recv("bf", timeout=5, as_torch=True), torch.ones(3, dtype=torch.bfloat16))


@pytest.mark.timeout(60)
def test_a_bridge_without_ml_dtypes_forwards_bfloat16_by_size(without_ml_dtypes):
    from shmrdv.bridge import protocol

    dtype = protocol.check_dtype(codec.BF16_CODE)
    assert dtype is protocol.BF16_STANDIN and dtype.itemsize == 2
    assert not codec.dtype_sendable(dtype)  # no rendezvous takes it: the receiving bridge refuses the message
    assert "pip install ml_dtypes" in str(protocol.standin_error("k"))
    frame = protocol.encode_meta(protocol.Frame.MSG, 1, b"k", b"bfloat16", (3,), 6)
    meta = protocol.parse_meta(frame[protocol.HEADER.size:], 1 << 20)
    assert meta.dtype is protocol.BF16_STANDIN and meta.nbytes == 6


def test_import_shmrdv_loads_neither_torch_nor_ml_dtypes():
    import subprocess

    code = "import sys, shmrdv; print('torch' in sys.modules, 'ml_dtypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
