"""shmrdv.Group collectives against numpy: every op, dtype family and world
size 1-4, sizes from 0 bytes to 64 MiB (across the one-phase limit of
allreduce, a rank's 1 MiB buffer and its per-peer regions), 0-d, empty,
non-contiguous and multi-dimensional arrays, out= (in place), torch tensors.

How it runs: the parent builds every case of a test up front (each rank's
input and each rank's expected result, computed with numpy), then forks one
process per rank; each joins one group and runs all the cases in order,
checking its own results and reporting, per case, any problem and a digest
of its result bytes. The parent fails on any problem, and checks that the
results that must be the same everywhere (allreduce, broadcast, allgather)
are bit-identical on every rank. fork, not spawn or forkserver: four ranks
start in 0.06 s (forkserver 3.7 s, spawn 5.8 s, measured on the 2-CPU dev
VM with torch loaded), and the cases reach the ranks without pickling (the
parent computes each case once, not each rank). Children are always joined
with a timeout and killed after it.

Expected values, as the group defines them: reductions fold the ranks'
inputs in rank order (acc = x0; acc = acc op x1; ...); integers wrap as
numpy's do; float16 and bfloat16 accumulate in float32 and round once at
the end; mean divides the sum by world_size in the accumulation type; bool
sum/max are "or", prod/min "and".
"""
import hashlib
import itertools
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_connections
from typing import Any, Callable, List, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes

import shmrdv
from shmrdv.group import SLOT_BYTES

ml_dtypes = pytest.importorskip("ml_dtypes")

try:
    from shmrdv._binding import lib as _lib

    ONE_SHOT_BYTES = int(_lib.RDV_COLL_ONE_SHOT_BYTES)
except (ImportError, AttributeError):  # pragma: no cover
    ONE_SHOT_BYTES = 64 << 10

KiB = 1 << 10
MiB = 1 << 20
CTX = multiprocessing.get_context("fork")
GROUP_TIMEOUT = 30.0  # every join and call of a rank: a hang becomes an error, not a stuck test
BF16 = np.dtype(ml_dtypes.bfloat16)

BOOL = [np.dtype(np.bool_)]
INTS = [np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)]
HALF = [np.dtype(np.float16), BF16]
FLOATS = HALF + [np.dtype(np.float32), np.dtype(np.float64)]
COMPLEX = [np.dtype(np.complex64), np.dtype(np.complex128)]
ALL_DTYPES = BOOL + INTS + FLOATS + COMPLEX

pytestmark = pytest.mark.timeout(120)


def ops_for(dtype: np.dtype) -> List[str]:
    if dtype in COMPLEX:
        return ["sum", "prod", "mean"]
    if dtype in FLOATS:
        return ["sum", "prod", "min", "max", "mean"]
    return ["sum", "prod", "min", "max", "band", "bor", "bxor"]


def dname(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == BF16 else str(dtype)


# ---------------------------------------------------------------- inputs and expected results


def gen(rng: np.random.Generator, dtype: np.dtype, shape: tuple, op: Optional[str]) -> np.ndarray:
    """A rank's input: full-range bits for integers (sums and products wrap),
    bounded magnitudes for float products, a few NaN/inf among other floats."""
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        v = rng.random(n) < (0.85 if op in ("prod", "min", "band") else 0.3)
    elif dtype in INTS:
        v = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)
    elif dtype in FLOATS:
        if op == "prod":
            v = rng.uniform(0.5, 2.0, n).astype(np.float32) * rng.choice(np.float32([-1, 1]), n)
        else:
            v = rng.standard_normal(n, dtype=np.float32) * np.float32(20)
            if n >= 8:
                k = max(1, n // 500)
                v[rng.integers(0, n, k)] = np.nan
                v[rng.integers(0, n, k)] = np.inf
                v[rng.integers(0, n, k)] = -np.inf
        v = v.astype(dtype)
    else:
        real = np.float32 if dtype == np.complex64 else np.float64
        if op == "prod":
            v = rng.uniform(0.5, 2.0, n) * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
        else:
            v = rng.standard_normal(n).astype(real) * 20 + 1j * rng.standard_normal(n).astype(real) * 20
        v = v.astype(dtype)
    return np.ascontiguousarray(v.reshape(shape))


_UFUNCS = {"sum": np.add, "mean": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
           "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def reduce_expected(inputs: List[np.ndarray], op: str) -> np.ndarray:
    """The reduction in rank order, in the accumulation type, rounded once."""
    dtype = inputs[0].dtype
    acc_dtype = np.dtype(np.float32) if dtype in HALF else dtype
    acc = np.array(inputs[0], dtype=acc_dtype, copy=True)
    with np.errstate(all="ignore"):
        for x in inputs[1:]:
            _UFUNCS[op](acc, np.asarray(x, dtype=acc_dtype), out=acc)
        if op == "mean":
            if acc_dtype.kind == "c":  # a complex over a real divisor: each part divided, as C does
                acc = (acc.real / len(inputs)) + 1j * (acc.imag / len(inputs))
                acc = acc.astype(acc_dtype)
            else:
                np.divide(acc, acc_dtype.type(len(inputs)), out=acc)
    return np.asarray(acc.astype(dtype))


ROW_KINDS = ("scatter", "alltoall")  # the input has world_size rows
SAME_EVERYWHERE = ("allreduce", "broadcast", "allgather")


@dataclass
class Case:
    label: str
    kind: str
    op: Optional[str]
    root: int
    layout: str  # see LAYOUTS
    inputs: List[Optional[np.ndarray]]  # per rank, as stored (strided layouts: the base, sliced [::2] in the rank)
    expected: List[Optional[np.ndarray]]  # per rank; None: the call returns None there
    close: bool = False  # compare within a few ulp instead of bit for bit (complex products)
    extra: dict = field(default_factory=dict)


LAYOUTS = {
    "plain": "the array as it is",
    "strided": "a non-contiguous view, base[::2]",
    "inplace": "out= the input itself",
    "inplace_strided": "out= the input itself, a non-contiguous view",
    "out": "out= another (contiguous) array",
    "out_strided": "out= a non-contiguous view of another array",
    "tensor": "a CPU torch tensor",
    "tensor_strided": "a non-contiguous tensor, t[::2]",
    "tensor_inplace": "out= the input tensor itself",
    "tensor_out": "out= another tensor",
}
STRIDED_INPUT = ("strided", "tensor_strided", "inplace_strided")
IN_PLACE = ("inplace", "inplace_strided", "tensor_inplace")

_seeds = itertools.count(1)


def make_case(W: int, kind: str, dtype: Any, shape: tuple, op: Optional[str] = None, root: int = 0,
              layout: str = "plain") -> Case:
    dtype = np.dtype(dtype)
    shape = tuple(shape)
    assert layout in LAYOUTS, layout
    strided = layout in STRIDED_INPUT
    stored = ((2 * shape[0],) + shape[1:]) if strided else shape
    seed = next(_seeds)
    inputs: List[Optional[np.ndarray]] = []
    for r in range(W):
        if kind == "scatter" and r != root:
            inputs.append(None)
        else:
            inputs.append(gen(np.random.default_rng([seed, r]), dtype, stored, op))
    eff = [None if x is None else (x[::2] if strided else x) for x in inputs]
    if kind in ("allreduce", "reduce", "reduce_scatter"):
        red = reduce_expected(eff, op)
        if kind == "allreduce":
            expected = [red] * W
        elif kind == "reduce":
            expected = [red if r == root else None for r in range(W)]
        else:
            k = shape[0] // W
            expected = [red[r * k:(r + 1) * k] for r in range(W)]
    elif kind == "broadcast":
        expected = [eff[root]] * W
    elif kind in ("allgather", "gather"):
        stacked = np.stack(eff)
        expected = [stacked if kind == "allgather" or r == root else None for r in range(W)]
    elif kind == "scatter":
        expected = [eff[root][r] for r in range(W)]
    elif kind == "alltoall":
        expected = [np.stack([eff[j][r] for j in range(W)]) for r in range(W)]
    else:
        raise AssertionError(kind)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    label = f"{kind}({op or ''}) {dname(dtype)}{list(shape)} {nbytes}B {layout} root={root}"
    return Case(label, kind, op, root, layout, inputs, expected, close=(op == "prod" and dtype in COMPLEX))


# ---------------------------------------------------------------- checking a result


def _bits(a: np.ndarray) -> np.ndarray:
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.kind == "c":
        flat = flat.view(np.float32 if flat.dtype == np.complex64 else np.float64)
    return flat


def mismatch(res: Any, exp: np.ndarray, close: bool = False) -> Optional[str]:
    """Why res is not exp (None if it is): bit for bit, except that NaN
    matches any NaN (its payload is the hardware's business) and that close
    compares complex values within a few ulp of their magnitude: a complex
    product's parts are differences of products, and numpy's SIMD loops
    (FMA) round them otherwise than C's a*c - b*d does."""
    if not isinstance(res, np.ndarray):
        return f"returned {type(res).__name__}, not an ndarray"
    if res.shape != exp.shape or res.dtype != exp.dtype:
        return f"shape {res.shape} dtype {res.dtype}, expected {exp.shape} {exp.dtype}"
    if res.tobytes() == exp.tobytes():
        return None
    if close:  # complex products: within a few ulp of the magnitude (numpy's own loops may use FMA)
        rtol = 1e-5 if res.dtype == np.complex64 else 1e-13
        r, e = res.reshape(-1), exp.reshape(-1)
        both_nan = np.isnan(r) & np.isnan(e)
        bad = ~both_nan & ~(np.abs(r - e) <= rtol * np.abs(e))
    else:
        r, e = _bits(res), _bits(exp)
        ui = np.dtype(f"u{r.dtype.itemsize}")
        bad = r.view(ui) != e.view(ui)
        if r.dtype in FLOATS:
            bad &= ~(np.isnan(r) & np.isnan(e))
    if not bad.any():
        return None
    where = np.flatnonzero(bad)
    i = int(where[0])
    return f"{where.size} of {r.size} values differ; first at flat index {i}: got {r[i]!r}, expected {e[i]!r}"


def digest(a: Any) -> Optional[bytes]:
    if a is None:
        return None
    return hashlib.blake2b(np.ascontiguousarray(a).tobytes(), digest_size=16).digest()


# ---------------------------------------------------------------- the ranks


def to_tensor(a: np.ndarray):
    import torch

    if a.dtype == BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def from_tensor(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def run_case(g: shmrdv.Group, case: Case):
    """(problem or None, digest of the result) for this rank's share of case."""
    rank = g.rank
    stored = case.inputs[rank]
    layout = case.layout
    tensor = layout.startswith("tensor")
    out = None
    arg: Any = stored
    if stored is not None:
        if layout in ("strided", "tensor_strided"):
            arg = stored[::2]
        if layout in ("inplace", "tensor_inplace", "out", "tensor_out", "out_strided"):
            arg = stored.copy()
        if layout in ("out", "tensor_out"):
            out = np.full_like(arg, 1)  # garbage the call must overwrite
        if layout == "out_strided":
            out = np.full((2 * arg.shape[0],) + arg.shape[1:], 1, arg.dtype)[::2]
        if layout == "inplace_strided":
            arg = stored.copy()[::2]
        if layout in ("inplace", "inplace_strided"):
            out = arg
        if tensor:
            arg = to_tensor(stored)[::2] if layout == "tensor_strided" else to_tensor(arg)
            if layout == "tensor_inplace":
                out = arg
            elif layout == "tensor_out":
                out = to_tensor(out)
    before = digest(stored) if stored is not None and stored.nbytes <= 8 * MiB else None
    kind = case.kind
    kw = {} if out is None else {"out": out}
    if kind == "allreduce":
        res = g.allreduce(arg, case.op, **kw)
    elif kind == "reduce":
        res = g.reduce(arg, case.root, case.op)
    elif kind == "reduce_scatter":
        res = g.reduce_scatter(arg, case.op)
    elif kind == "broadcast":
        res = g.broadcast(arg, case.root, **kw)
    elif kind == "allgather":
        res = g.allgather(arg)
    elif kind == "gather":
        res = g.gather(arg, case.root)
    elif kind == "scatter":
        res = g.scatter(arg if rank == case.root else case.extra.get("nonroot_arg"), case.root)
    elif kind == "alltoall":
        res = g.alltoall(arg)
    else:
        raise AssertionError(kind)
    problems = []
    if before is not None and layout not in IN_PLACE and digest(stored) != before:
        problems.append("the input was modified")
    if out is not None and res is not out:
        problems.append("out= given, but the result is another object")
    expected = case.expected[rank]
    if expected is not None:
        expected = np.asarray(expected)
    if expected is None:
        if res is not None:
            problems.append(f"expected None on this rank, got {type(res).__name__}")
        return ("; ".join(problems) or None), None
    want_tensor = tensor or (kind == "scatter" and case.layout.startswith("tensor"))
    if want_tensor:
        import torch

        if not isinstance(res, torch.Tensor):
            return f"expected a torch tensor, got {type(res).__name__}", None
        res = from_tensor(res)
    why = mismatch(res, expected, case.close)
    if why:
        problems.append(why)
    return ("; ".join(problems) or None), digest(res)


def run_cases(g: shmrdv.Group, cases: List[Case]):
    report = []
    with np.errstate(all="ignore"):
        for case in cases:
            try:
                problem, dig = run_case(g, case)
            except Exception as exc:
                raise RuntimeError(f"case {case.label}: {type(exc).__name__}: {exc}") from exc
            report.append((case.label, problem, dig))
    return report


_names = itertools.count()


def group_name(tag: str = "g") -> str:
    return f"tg-{os.getpid()}-{next(_names)}-{tag}"


def _rank_main(rank: int, world: int, name: str, body: Callable, conn, group_kw: dict) -> None:
    status = 1
    try:
        try:
            g = shmrdv.Group(name, rank, world, **group_kw)
            try:
                result = body(g)
            except BaseException:
                try:  # release the others at once rather than at their timeout
                    g.abort(f"rank {rank} failed: {traceback.format_exc(limit=-1).strip()[-300:]}")
                except Exception:
                    pass
                raise
            finally:
                g.close()
            conn.send(("ok", result))
            status = 0
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    finally:
        try:
            conn.close()
        finally:
            os._exit(status)


def run_group(world: int, body: Callable, *, timeout: float = 90.0, name: Optional[str] = None,
              group_timeout: Optional[float] = GROUP_TIMEOUT, **group_kw) -> List[Any]:
    """Run body(group) on world forked ranks of one group; their return values,
    by rank. Fails if a rank raised, hung past timeout (then killed) or exited
    without a report. group_timeout is the Group's timeout= (each join and call)."""
    name = name or group_name()
    group_kw["timeout"] = group_timeout
    procs, conns = [], []
    reports: List[Any] = [None] * world
    try:
        for rank in range(world):
            reader, writer = CTX.Pipe(duplex=False)
            p = CTX.Process(target=_rank_main, args=(rank, world, name, body, writer, group_kw), daemon=True)
            p.start()
            writer.close()
            procs.append(p)
            conns.append(reader)
        deadline = time.monotonic() + timeout
        pending = {c: r for r, c in enumerate(conns)}
        while pending and time.monotonic() < deadline:
            for c in wait_for_connections(list(pending), max(0.0, deadline - time.monotonic())):
                r = pending.pop(c)
                try:
                    reports[r] = c.recv()
                except EOFError:
                    reports[r] = ("error", f"rank {r} exited without a report")
        hung = sorted(pending.values())
        for p in procs:
            p.join(max(0.5, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        for c in conns:
            c.close()
        for p in procs:
            if not p.is_alive():
                p.close()
    assert not hung, f"ranks {hung} still running after {timeout} s (killed); reports: {reports}"
    errors = [f"rank {r}: {rep[1]}" for r, rep in enumerate(reports) if rep[0] != "ok"]
    assert not errors, "\n".join(errors)
    assert not [e for e in os.listdir("/dev/shm") if name in e], "the group's segment was left in /dev/shm"
    return [rep[1] for rep in reports]


def run_and_check(W: int, cases: List[Case], **kw) -> None:
    reports = run_group(W, lambda g: run_cases(g, cases), **kw)
    problems = []
    for r, rep in enumerate(reports):
        assert len(rep) == len(cases), f"rank {r} ran {len(rep)} of {len(cases)} cases"
        problems += [f"rank {r}: {label}: {p}" for label, p, _ in rep if p]
    for i, case in enumerate(cases):
        if case.kind in SAME_EVERYWHERE:
            digests = {reports[r][i][2] for r in range(W)}
            if len(digests) != 1:
                problems.append(f"{case.label}: the ranks' results are not bit-identical")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:40])


# ---------------------------------------------------------------- the tests

WORLDS = [1, 2, 3, 4]


@pytest.mark.parametrize("W", WORLDS)
def test_allreduce_every_op_and_dtype(W):
    """Every dtype x op: 0-d, empty, odd, multi-dimensional, non-contiguous,
    out= (a new array, and the input itself), and the one-phase limit (64
    KiB) and one element past it."""
    cases = []
    for dtype in ALL_DTYPES:
        edge = ONE_SHOT_BYTES // dtype.itemsize
        for op in ops_for(dtype):
            cases += [
                make_case(W, "allreduce", dtype, (), op),
                make_case(W, "allreduce", dtype, (0,), op),
                make_case(W, "allreduce", dtype, (7,), op),
                make_case(W, "allreduce", dtype, (4, 5, 3), op, layout="inplace"),
                make_case(W, "allreduce", dtype, (33,), op, layout="strided"),
                make_case(W, "allreduce", dtype, (2, 0, 3), op, layout="out"),
                make_case(W, "allreduce", dtype, (5, 2), op, layout="out_strided"),
                make_case(W, "allreduce", dtype, (9, 3), op, layout="inplace_strided"),
                make_case(W, "allreduce", dtype, (edge,), op),
                make_case(W, "allreduce", dtype, (edge + 1,), op, layout="inplace" if op == "sum" else "plain"),
            ]
    run_and_check(W, cases)


def _chunk_elems(W: int, itemsize: int, slot: int = SLOT_BYTES) -> int:
    """Elements of one chunk of a multi-phase reduction: W regions of slot // W bytes (whole elements)."""
    return W * ((slot // W) // itemsize)


@pytest.mark.slow
@pytest.mark.parametrize("W", WORLDS)
def test_allreduce_across_the_chunk_thresholds(W):
    """Sizes about a rank's 1 MiB buffer, a chunk (W per-peer regions), and 3
    MiB plus odd counts; in place and out-of-place; several element sizes."""
    cases = []
    dtypes = [np.int8, BF16, np.float32, np.complex128] + ([np.uint16, np.float64, np.bool_] if W in (2, 3) else [])
    for dtype in map(np.dtype, dtypes):
        slot_elems = SLOT_BYTES // dtype.itemsize
        chunk = _chunk_elems(W, dtype.itemsize)
        sizes = sorted({slot_elems - 3, slot_elems, slot_elems + 5, chunk - 1, chunk + 1, 3 * MiB // dtype.itemsize + 7})
        for i, n in enumerate(sizes):
            layout = ("inplace", "plain", "out")[i % 3]
            cases.append(make_case(W, "allreduce", dtype, (n,), "sum", layout=layout))
        cases.append(make_case(W, "allreduce", dtype, (2 * chunk + 3,), "prod" if dtype != np.bool_ else "bxor"))
        ops = ops_for(dtype)
        cases.append(make_case(W, "allreduce", dtype, (chunk + 2,), "max" if "max" in ops else "mean",
                               layout="inplace_strided"))
        cases.append(make_case(W, "allreduce", dtype, (slot_elems + 1,), "min" if "min" in ops else "prod",
                               layout="out_strided"))
    cases.append(make_case(W, "allreduce", np.float32, (3 * MiB // 4 + 13,), "max", layout="strided"))
    cases.append(make_case(W, "allreduce", np.float16, (3, 1 << 17), "mean", layout="inplace"))
    cases.append(make_case(W, "allreduce", np.int64, (3 * MiB // 8 + 1,), "bxor"))
    cases.append(make_case(W, "allreduce", np.uint32, ((SLOT_BYTES + ONE_SHOT_BYTES) // 4 + 1,), "min"))
    run_and_check(W, cases)


@pytest.mark.slow
@pytest.mark.parametrize("W", WORLDS)
def test_rooted_and_data_movement_collectives(W):
    """broadcast, reduce, gather, scatter from each root; allgather, alltoall,
    reduce_scatter; every dtype family; sizes from 0 bytes across a rank's
    buffer and across the per-peer region (slot // W bytes)."""
    cases = []
    region = SLOT_BYTES // W // 64 * 64
    fams = [np.bool_, np.int8, np.uint64, np.float16, BF16, np.float32, np.float64, np.complex64]
    for dtype in map(np.dtype, fams):
        isz = dtype.itemsize
        small = [(), (0,), (5,), (3, 4)]
        for root in range(W):
            for shape in small:
                cases.append(make_case(W, "broadcast", dtype, shape, root=root))
                cases.append(make_case(W, "gather", dtype, shape, root=root))
            cases.append(make_case(W, "reduce", dtype, (9,), ops_for(dtype)[root % len(ops_for(dtype))], root=root))
            cases.append(make_case(W, "scatter", dtype, (W,), root=root))
            cases.append(make_case(W, "scatter", dtype, (W, 3, 2), root=root))
            cases.append(make_case(W, "scatter", dtype, (W, 0), root=root))
        for shape in small:
            cases.append(make_case(W, "allgather", dtype, shape))
        cases.append(make_case(W, "allgather", dtype, (6,), layout="strided"))
        cases.append(make_case(W, "alltoall", dtype, (W,)))
        cases.append(make_case(W, "alltoall", dtype, (W, 2, 3)))
        cases.append(make_case(W, "alltoall", dtype, (W, 0, 5)))
        cases.append(make_case(W, "alltoall", dtype, (W, 7), layout="strided"))
        for op in ops_for(dtype):
            cases.append(make_case(W, "reduce_scatter", dtype, (W, 3), op))
            cases.append(make_case(W, "reduce", dtype, (4, 2), op, root=W - 1))
        cases.append(make_case(W, "reduce_scatter", dtype, (0, 4), "sum"))
        cases.append(make_case(W, "reduce_scatter", dtype, (2 * W, 5), "sum", layout="strided"))
        cases.append(make_case(W, "broadcast", dtype, (11,), root=W - 1, layout="inplace"))
        cases.append(make_case(W, "broadcast", dtype, (2, 5), root=0, layout="out"))
        cases.append(make_case(W, "broadcast", dtype, (13,), root=W // 2, layout="strided"))
        cases.append(make_case(W, "broadcast", dtype, (7, 2), root=W - 1, layout="out_strided"))
        cases.append(make_case(W, "broadcast", dtype, (8,), root=0, layout="inplace_strided"))
        # large: across the buffer (broadcast, gather chunks of SLOT_BYTES) and the region (per-peer pieces)
        if dtype in (np.dtype(np.int8), np.dtype(np.float32), BF16, np.dtype(np.complex64)):
            big = [SLOT_BYTES // isz - 1, SLOT_BYTES // isz + 3, 3 * MiB // isz + 7]
            for i, n in enumerate(big):
                root = i % W
                cases.append(make_case(W, "broadcast", dtype, (n,), root=root))
                cases.append(make_case(W, "allgather", dtype, (n,)))
                cases.append(make_case(W, "gather", dtype, (n,), root=(root + 1) % W))
                cases.append(make_case(W, "reduce", dtype, (n,), "sum", root=root))
            for rows in (region // isz - 1, region // isz + 1, (region // isz) * 3 + 5):
                cases.append(make_case(W, "scatter", dtype, (W, rows), root=W - 1))
                cases.append(make_case(W, "alltoall", dtype, (W, rows)))
                cases.append(make_case(W, "reduce_scatter", dtype, (W, rows), "sum"))
    run_and_check(W, cases)


@pytest.mark.parametrize("W", [2, 3])
def test_torch_tensors_in_and_out(W):
    """CPU tensors give tensors back (bfloat16 and bool included); out=tensor
    is filled in place and returned; non-contiguous tensors work; a tensor
    scattered by the root arrives as a tensor everywhere."""
    pytest.importorskip("torch")
    cases = []
    for dtype in map(np.dtype, [np.float32, BF16, np.float16, np.int32, np.bool_, np.complex64, np.uint8]):
        op = ops_for(dtype)[1]
        for layout in ("tensor", "tensor_strided", "tensor_inplace", "tensor_out"):
            cases.append(make_case(W, "allreduce", dtype, (6, 3), op, layout=layout))
            cases.append(make_case(W, "broadcast", dtype, (6, 3), root=W - 1, layout=layout))
        cases.append(make_case(W, "allreduce", dtype, (ONE_SHOT_BYTES // dtype.itemsize + 9,), "sum", layout="tensor_inplace"))
        cases.append(make_case(W, "allreduce", dtype, (), "max" if dtype not in COMPLEX else "sum", layout="tensor"))
        for kind in ("allgather", "alltoall", "scatter"):
            cases.append(make_case(W, kind, dtype, (W, 4), root=1, layout="tensor"))
        cases.append(make_case(W, "gather", dtype, (5,), root=1, layout="tensor"))
        cases.append(make_case(W, "reduce", dtype, (5,), "sum", root=0, layout="tensor"))
        cases.append(make_case(W, "reduce_scatter", dtype, (2 * W, 3), "sum", layout="tensor_strided"))
    run_and_check(W, cases)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_allreduce_64_mib():
    """One 64 MiB float32 allreduce (and broadcast) on two ranks."""
    n = 64 * MiB // 4
    a0 = (np.arange(n, dtype=np.float32) % np.float32(4099)) * np.float32(0.25)
    a1 = ((np.arange(n, dtype=np.float32) * np.float32(7)) % np.float32(1021)) - np.float32(500)
    expected = a0 + a1
    cases = [
        Case("allreduce 64 MiB float32", "allreduce", "sum", 0, "plain", [a0, a1], [expected, expected]),
        Case("allreduce 64 MiB float32 in place", "allreduce", "max", 0, "inplace", [a0, a1],
             [np.maximum(a0, a1)] * 2),
        Case("broadcast 64 MiB float32", "broadcast", None, 1, "plain", [a0, a1], [a1, a1]),
    ]
    run_and_check(2, cases, timeout=150)


def _one_gib_allreduce(g: shmrdv.Group) -> Any:
    n = (1 << 30) // 4
    a = np.full(n, g.rank + 1, np.float32)  # sums are exact: every element is 1 + 2
    g.allreduce(a, out=a)
    return (int(np.count_nonzero(a != 3.0)), float(a[0]), float(a[-1]))


@pytest.mark.slow
def test_allreduce_of_1_gib_through_its_2_mib_workspace():
    """The real size: 1 GiB per rank, in place, through two 1 MiB buffers per
    rank (1025 phases), every element right on both ranks."""
    assert run_group(2, _one_gib_allreduce, timeout=110) == [(0, 3.0, 3.0)] * 2


@pytest.mark.parametrize("W", [2, 3, 4])
def test_large_messages_through_a_small_workspace(W):
    """Group(_slot_bytes=4096): a 4 KiB buffer per rank, so a 24 MiB
    allreduce takes thousands of phases (the "1 GiB through a small
    workspace" case, scaled down); every kind crosses its chunking many times."""
    slot = 4096
    n = 24 * MiB // 4 + 11 if W != 3 else 12 * MiB // 4 + 5
    cases = [make_case(W, "allreduce", np.float32, (n,), "sum", layout="inplace" if W == 2 else "plain")]
    region = slot // W // 64 * 64
    for dtype in map(np.dtype, [np.int16, BF16, np.complex128]):
        isz = dtype.itemsize
        cases.append(make_case(W, "allreduce", dtype, (_chunk_elems(W, isz, slot) * 37 + 1,), ops_for(dtype)[0]))
        cases.append(make_case(W, "allreduce", dtype, (ONE_SHOT_BYTES // isz,), "sum"))  # one-phase size > slot: chunked
        cases.append(make_case(W, "reduce", dtype, (MiB // isz + 3,), "sum", root=W - 1))
        cases.append(make_case(W, "reduce_scatter", dtype, (W, region // isz * 9 + 1), "sum"))
        cases.append(make_case(W, "broadcast", dtype, (MiB // isz + 5,), root=W - 1))
        cases.append(make_case(W, "allgather", dtype, (slot * 5 // isz + 1,)))
        cases.append(make_case(W, "gather", dtype, (slot * 5 // isz + 1,), root=W - 1))
        cases.append(make_case(W, "scatter", dtype, (W, region // isz * 7 + 3), root=0))
        cases.append(make_case(W, "alltoall", dtype, (W, region // isz * 7 + 3)))
    run_and_check(W, cases, _slot_bytes=slot, timeout=100)


def test_half_precision_accumulates_in_float32_and_rounds_once():
    """Values where rounding after every step would differ: float16 65504 +
    65504 - 65504 is 65504 (not inf); bfloat16 1 + 2**-8 + 2**-8 is 1 + 2**-7
    (not 1)."""
    W = 3
    f16 = np.dtype(np.float16)
    x16 = [np.array([65504, 1, 2048, -65504], f16), np.array([65504, 2 ** -11, 1, 65504], f16),
           np.array([-65504, 2 ** -11, 1, -65504], f16)]
    xbf = [np.array([1, 256, 3], BF16), np.array([2 ** -8, 1, 2 ** -8], BF16), np.array([2 ** -8, 1, 2 ** -8], BF16)]
    e16 = np.array([65504, 1 + 2 ** -10, 2050, -65504], f16)
    ebf = np.array([1 + 2 ** -7, 258, 3], BF16)
    assert (reduce_expected(x16, "sum") == e16).all() and (reduce_expected(xbf, "sum") == ebf).all()
    e16_mean = (sum(x.astype(np.float32) for x in x16) / np.float32(3)).astype(f16)
    cases = [
        Case("f16 sum", "allreduce", "sum", 0, "plain", x16, [e16] * W),
        Case("bf16 sum", "allreduce", "sum", 0, "plain", xbf, [ebf] * W),
        Case("f16 mean", "allreduce", "mean", 0, "plain", x16, [e16_mean] * W),
        Case("bf16 sum reduce", "reduce", "sum", 2, "plain", xbf, [None, None, ebf]),
    ]
    run_and_check(W, cases)


def test_integer_sum_and_prod_wrap_like_numpy():
    W = 4
    i8 = [np.array([127, -128, 100, 3], np.int8)] * W
    u64 = [np.array([2 ** 63, 2 ** 64 - 1, 3], np.uint64)] * W
    cases = [
        Case("i8 sum", "allreduce", "sum", 0, "plain", i8, [np.array([-4, 0, -112, 12], np.int8)] * W),
        Case("i8 prod", "allreduce", "prod", 0, "plain", i8, [np.array([1, 0, 0, 81], np.int8)] * W),
        Case("u64 sum", "allreduce", "sum", 0, "plain", u64, [np.array([0, 2 ** 64 - 4, 12], np.uint64)] * W),
        Case("u64 prod", "allreduce", "prod", 0, "plain", u64, [np.array([0, 1, 81], np.uint64)] * W),
    ]
    for c in cases:  # the expectations above are numpy's own
        assert mismatch(reduce_expected(c.inputs, c.op), c.expected[0]) is None, c.label
    run_and_check(W, cases)


KINDS_FOR_RANDOM = ["allreduce", "broadcast", "allgather", "reduce_scatter", "reduce", "gather", "scatter", "alltoall"]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(W=st.integers(1, 4),
       calls=st.lists(st.tuples(st.sampled_from(KINDS_FOR_RANDOM), st.sampled_from(ALL_DTYPES),
                                array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7),
                                st.integers(0, 63), st.sampled_from(["plain", "strided", "inplace"])),
                      min_size=1, max_size=12))
@pytest.mark.slow
def test_random_shapes(W, calls):
    cases = []
    for kind, dtype, shape, pick, layout in calls:
        op = ops_for(dtype)[pick % len(ops_for(dtype))]
        root = pick % W
        if kind in ROW_KINDS:
            shape = (W,) + shape
        elif kind == "reduce_scatter":
            shape = (W * (shape[0] if shape else 1),) + shape[1:]
        if layout == "strided" and not shape:
            layout = "plain"
        if layout == "inplace" and kind not in ("allreduce", "broadcast"):
            layout = "plain"
        cases.append(make_case(W, kind, dtype, shape, op, root=root, layout=layout))
    run_and_check(W, cases, timeout=60)


@pytest.mark.parametrize("W", [1, 2, 3, 4])
def test_barrier_waits_for_every_rank(W):
    """Rank r arrives r * 80 ms late; nobody leaves a barrier before the last arrives."""

    def body(g):
        times = []
        for round_ in range(3):
            time.sleep(0.08 * ((g.rank + round_) % W))
            arrive = time.monotonic()
            g.barrier()
            times.append((arrive, time.monotonic()))
        for _ in range(200):  # and many in a row
            g.barrier()
        return times

    times = run_group(W, body)
    for round_ in range(3):
        last_arrival = max(times[r][round_][0] for r in range(W))
        for r in range(W):
            assert times[r][round_][1] >= last_arrival, f"rank {r} left barrier {round_} before the last arrived"


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def test_argument_errors_are_local_and_leave_the_group_working():
    """Bad arguments raise on the calling rank before any data is shared
    (every rank here passes the same, so each one's refused call pairs with
    the others'); the group goes on (the next call is right)."""
    W = 2

    def body(g):
        a = np.arange(6, dtype=np.float32)
        i = np.arange(6, dtype=np.int32)
        bad = [
            (shmrdv.InvalidArgument, lambda: g.allreduce(i, "mean")),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a, "band")),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a.astype(np.complex64), "min")),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a, "median")),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a, out=np.empty(5, np.float32))),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a, out=np.empty(6, np.float64))),
            (shmrdv.InvalidArgument, lambda: g.allreduce(a, out=_read_only(np.empty(6, np.float32)))),
            (shmrdv.InvalidType, lambda: g.allreduce(np.array(["x"], object))),
            (shmrdv.InvalidType, lambda: g.allreduce(np.array(["xy"]))),
            (shmrdv.InvalidArgument, lambda: g.reduce_scatter(np.arange(3.0))),
            (shmrdv.InvalidArgument, lambda: g.reduce_scatter(np.float64(1.0))),
            (shmrdv.InvalidArgument, lambda: g.alltoall(np.arange(3.0))),
            (shmrdv.InvalidArgument, lambda: g.broadcast(a, root=W)),
            (shmrdv.InvalidArgument, lambda: g.reduce(a, root=-1)),
            (shmrdv.InvalidType, lambda: g.gather(a, root=1.0)),
            (shmrdv.InvalidType, lambda: g.broadcast(a, root=True)),
        ]
        seen = []
        for exc_type, call in bad:
            try:
                call()
            except exc_type:
                seen.append(None)
            except Exception as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
            else:
                seen.append("no error")
        assert issubclass(shmrdv.InvalidArgument, ValueError)
        total = g.allreduce(np.full(4, g.rank + 1, np.int64))
        read_only = g.allreduce(np.frombuffer(np.full(4, g.rank + 1, np.int64).tobytes(), np.int64))
        assert read_only.flags.writeable and read_only.tolist() == [3] * 4
        return seen, total.tolist()

    for seen, total in run_group(W, body):
        assert not [(i, why) for i, why in enumerate(seen) if why], [(i, why) for i, why in enumerate(seen) if why]
        assert total == [3, 3, 3, 3]


def test_data_movement_of_dtypes_that_do_not_reduce():
    """broadcast, allgather, gather and alltoall move any fixed-size dtype:
    bytes, datetime64, structured records (compared byte for byte)."""
    W = 3
    dtypes = [np.dtype("S7"), np.dtype("datetime64[ns]"), np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")])]

    def rows(dtype, r, n):
        raw = np.random.default_rng([len(dtype.str), dtype.itemsize, r]).integers(0, 256, n * dtype.itemsize,
                                                                                   dtype=np.uint8)
        return raw.view(dtype)

    def body(g):
        problems = []
        for dtype in dtypes:
            mine = rows(dtype, g.rank, 1000)
            everyone = [rows(dtype, r, 1000) for r in range(W)]
            results = {
                "broadcast": (g.broadcast(mine, root=1), everyone[1]),
                "allgather": (g.allgather(mine), np.stack(everyone)),
                "gather": (g.gather(mine, root=2), np.stack(everyone) if g.rank == 2 else None),
                "alltoall": (g.alltoall(mine[:999].reshape(W, 333)),
                             np.stack([everyone[j][:999].reshape(W, 333)[g.rank] for j in range(W)])),
            }
            for kind, (got, want) in results.items():
                if want is None:
                    ok = got is None
                else:
                    ok = got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
                if not ok:
                    problems.append(f"{kind} {dtype}")
        return problems

    for r, problems in enumerate(run_group(W, body)):
        assert problems == [], f"rank {r}: {problems}"


def test_allreduce_out_overlapping_the_input():
    W = 2

    def body(g):
        wrong = {}
        for n in (5000, 300_000):
            buf = np.arange(n + 1, dtype=np.float32) * (g.rank + 1)
            res = g.allreduce(buf[:-1], out=buf[1:])
            wrong[n] = int((res != np.arange(n, dtype=np.float32) * 3).sum())
        return wrong

    for r, wrong in enumerate(run_group(W, body)):
        assert wrong == {5000: 0, 300_000: 0}, f"rank {r}: wrong values by size: {wrong}"


def _misaligned(n: int, dtype, fill) -> np.ndarray:
    """n elements of dtype starting one byte into a buffer: misaligned."""
    dtype = np.dtype(dtype)
    a = np.frombuffer(bytearray(n * dtype.itemsize + 1), dtype, count=n, offset=1)
    a[:] = fill
    assert not a.flags.aligned
    return a


def test_misaligned_arrays_are_reduced_through_aligned_copies():
    """The kernels' vector loops need elements at their natural alignment: a
    misaligned input or out goes through aligned memory (the short path of
    allreduce included), with the right result and out filled."""
    W = 2

    def body(g):
        got = {}
        for dtype in (np.float32, np.float64, np.int16, np.complex128):
            a = _misaligned(70_000, dtype, g.rank + 1)  # one phase and chunked both
            for _ in range(2):  # the second time through allreduce's short path
                got[f"{np.dtype(dtype)} new"] = bool((g.allreduce(a) == 3).all())
            b = _misaligned(70_000, dtype, g.rank + 1)
            g.allreduce(b, out=b)
            got[f"{np.dtype(dtype)} in place"] = bool((b == 3).all())
            r = g.reduce_scatter(_misaligned(2 * 999, dtype, g.rank + 1))
            got[f"{np.dtype(dtype)} reduce_scatter"] = bool((r == 3).all())
        return got

    for r, got in enumerate(run_group(W, body)):
        assert all(got.values()), f"rank {r}: {got}"


def test_scatter_of_too_many_dimensions_is_a_clear_error():
    W = 2
    from shmrdv import limits

    def body(g):
        a = np.zeros((W,) + (1,) * limits.NDIM_MAX, np.float32)
        try:
            g.scatter(a if g.rank == 0 else None, 0)
        except shmrdv.SegmentMismatch as exc:
            return f"SegmentMismatch: {exc}"
        except shmrdv.InvalidArgument:
            return None
        except shmrdv.RendezvousError as exc:  # a non-root's wait for a root that refused: fine too
            return None if g.rank else f"{type(exc).__name__}: {exc}"
        return "no error" if g.rank == 0 else None

    reports = run_group(W, body, timeout=30, group_timeout=3)
    assert reports == [None] * W, reports
