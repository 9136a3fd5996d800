"""``shmrdv.loader.DataLoader`` measured against torch's ``DataLoader`` on
the same datasets, in one run, and the report: tables of medians with
ranges and ratios, the goals, and a plot.

``shmrdv bench --loader`` runs it (``--smoke``: a few batches of each
case, to check that everything runs; the figures mean nothing).

What is measured, each case alternating the loaders (their order rotates
from round to round) and reported as the median and the range over rounds:

- throughput, batches/s (and GB/s) over one epoch of a fresh loader with
  two persistent workers (``fork``), after a warm-up epoch that is not
  timed (it starts the workers and touches their memory): shmrdv, torch's
  DataLoader (``num_workers=2``) and the batches built in the trainer's own
  process (torch's DataLoader, ``num_workers=0``). Cases: ``batch_size=None``
  with each item a float32 tensor of 1 MiB or 19 MiB made in
  ``__getitem__`` by ``torch.full`` (almost no work), by a fill and
  ``torch.rand`` over 60 % of it, or by ``torch.rand`` (the work workers
  exist for); image-like batches of 32 uint8
  3x224x224 numpy arrays and int labels collated by the default collate.
  The trainer keeps torch's default intra-op threads, as a trainer would
  (the in-process batches use them; on a loaded machine their barrier
  spins while one of them waits for a CPU); both loaders' workers use one;
- in the same timed epochs, the trainer's CPU time per batch: the CPU time
  of the trainer's process (all its threads: torch's queue feeder threads,
  its intra-op threads for the in-process batches), not its workers'
  (``time.process_time``);
- the trainer's resident memory before the timed epoch, halfway and after
  it (``/proc/self/status``): VmRSS, which is RssAnon + RssFile + RssShmem.
  VmRSS is the figure judged, because a trainer can grow in either kind of
  page: RssAnon is its private memory (batches, copies or pickles it keeps
  would show there), RssShmem the shared pages it has mapped (batches it
  keeps mapped would: torch maps a segment per batch and unmaps it when the
  batch is dropped; shmrdv maps its arena once, each page faulted in by
  its first touch, so shmrdv's VmRSS holds the arena pages the trainer has
  read, at most ``shm_size``, 256 MiB, and no more whatever the number of
  batches). It must not grow with the batches consumed: at most
  ``RSS_BUDGET_KIB`` over an epoch;
- the time to the first batch with two ``spawn`` workers: a fresh loader
  each time, from the DataLoader's construction through ``iter()`` to the
  first batch (what follows is not timed: the rest of its short epoch,
  so that no worker is stopped while it is still starting, then stopping
  the workers).

What the trainer does with each batch (``TRAINER_WORK``): it reads the
first element of each tensor of the batch and checks that it is the value
its sample index says (the order and the data are checked, never a pass
over the data), then drops the batch before asking for the next one.

The datasets are defined here, at module level, so that spawned workers
can import them. torch is needed (it is one side of every comparison):
without it the command prints a line and measures nothing. Peak memory is
a few hundred MiB: a 256 MiB arena, batches of at most 19 MiB, four of them
in flight per loader and one loader at a time.
"""
import gc
import json
import multiprocessing
import signal
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..loader import DEFAULT_SHM_SIZE
from .common import write_outputs
from .errors import MeasurementFailed, OptionsError
from .machine import machine

try:
    import torch
except ImportError:  # the command says so and measures nothing
    torch = None

MiB = 1 << 20
WORKERS = 2
IMAGE_SHAPE = (3, 224, 224)
IMAGE_BATCH = 32
LABELS = 1000
RSS_BUDGET_KIB = 16 * 1024  # growth allowed over a timed epoch (the epochs consume gigabytes)
SETTLE_S = 15.0  # how long the workers of a finished run may take to exit
THROUGHPUT_CONTEXT = "fork"
FIRST_BATCH_CONTEXT = "spawn"
FIRST_BATCH_ITEMS = 16

LIBRARIES = ("in-process", "torch", "shmrdv")
LABEL = {"in-process": "in-process (torch, num_workers=0)", "torch": "torch DataLoader (2 workers)",
         "shmrdv": "shmrdv.loader (2 workers)"}
TRAINER_WORK = ("reads the first element of each tensor of the batch (checked against its sample index) in a "
                "plain `for batch in loader` loop (a batch lives until the next replaces it); no pass over the data")
_RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


# ---------------------------------------------------------------------------
# Datasets (module level: spawned workers import them)
# ---------------------------------------------------------------------------


class TensorItems:
    """Map-style dataset for ``batch_size=None``: item ``i`` is a float32
    tensor of ``nbytes`` filled with ``i``, built in ``__getitem__``."""

    def __init__(self, length: int, nbytes: int) -> None:
        self.length, self.numel = length, nbytes // 4

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return torch.full((self.numel,), float(i))


class RandomItems(TensorItems):
    """Like ``TensorItems``, but each item is computed: ``torch.rand`` from a
    generator seeded with ``i`` (element 0 then set to ``i``), about 1 GB/s
    of work on one CPU here, the kind of work (decoding, augmenting) that
    workers exist to take off the trainer. ``TensorItems``' fill costs
    almost nothing: there the transport's own cost shows."""

    def __getitem__(self, i: int) -> Any:
        item = torch.rand(self.numel, generator=torch.Generator().manual_seed(i))
        item[0] = i
        return item


class PartlyRandomItems(TensorItems):
    """Between the two: each item is filled with ``i``, then its first
    ``RANDOM_SHARE`` computed by ``torch.rand`` (seeded with ``i``), about
    half a millisecond of work per MiB on one CPU here (1.5–2 GB/s): items
    whose cost neither hides the transport nor is the transport's alone."""

    RANDOM_SHARE = 0.6

    def __getitem__(self, i: int) -> Any:
        item = torch.full((self.numel,), float(i))
        k = int(self.numel * self.RANDOM_SHARE)
        item[1:k] = torch.rand(k - 1, generator=torch.Generator().manual_seed(i))
        return item


class Images:
    """Map-style dataset of image-like samples: ``(uint8 array 3x224x224
    filled with i % 256, label i % 1000)``, built in ``__getitem__``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return np.full(IMAGE_SHAPE, i % 256, np.uint8), i % LABELS


def _touch_tensor(batch: Any, k: int) -> None:
    first = batch[0].item()
    if first != k:
        raise AssertionError(f"batch {k} starts with {first}, not {float(k)}")


def _touch_images(batch: Any, k: int) -> None:
    images, labels = batch
    i = k * IMAGE_BATCH
    pixel, label = images[0, 0, 0, 0].item(), labels[0].item()
    if pixel != i % 256 or label != i % LABELS:
        raise AssertionError(f"batch {k} starts with pixel {pixel} and label {label}, "
                             f"not {i % 256} and {i % LABELS}")


@dataclass(frozen=True)
class Case:
    """One throughput case: its dataset (made for a number of batches), its
    loader arguments, how the trainer touches a batch, and its goals
    (shmrdv's batches/s at least that many times the other's)."""

    name: str
    key: str  # a short name for test ids
    batch_bytes: int
    batch_size: Optional[int]
    dataset: Callable[[int], Any]
    touch: Callable[[Any, int], None]
    batches: int  # per timed epoch, full run
    smoke_batches: int
    goals: Dict[str, float]


_TENSOR_ITEMS = {"tensor": TensorItems, "partly random tensor": PartlyRandomItems, "random tensor": RandomItems}


def _tensor_case(mib: int, batches: int, kind: str = "tensor") -> Case:
    nbytes = mib * MiB
    items = _TENSOR_ITEMS[kind]
    key = kind.split()[0]
    return Case(f"{kind} {mib} MiB", f"{key}-{mib}MiB", nbytes, None, lambda n: items(n, nbytes),
                _touch_tensor, batches, 6, {"torch": 4.0, "in-process": 1.0})


_IMAGE_BYTES = IMAGE_BATCH * (int(np.prod(IMAGE_SHAPE)) + 8)  # uint8 pixels and int64 labels

# Batch counts for a full run of about two minutes on a 2-CPU machine
# (torch's DataLoader, the slowest, takes one to two seconds per epoch).
CASES: Sequence[Case] = (
    _tensor_case(1, 800),
    _tensor_case(19, 60),
    _tensor_case(1, 600, "partly random tensor"),
    _tensor_case(19, 40, "partly random tensor"),
    _tensor_case(1, 400, "random tensor"),
    _tensor_case(19, 30, "random tensor"),
    Case("images 32x3x224x224 uint8", "images", _IMAGE_BYTES, IMAGE_BATCH, lambda n: Images(n * IMAGE_BATCH),
         _touch_images, 160, 4, {"torch": 3.0}),
)


@dataclass(frozen=True)
class Plan:
    rounds: int  # of each throughput case, every loader once per round
    first_batch_rounds: int
    first_batch_warmup: int  # rounds not counted (the first spawns read torch from disk)

    @staticmethod
    def for_mode(smoke: bool) -> "Plan":
        return Plan(1, 1, 0) if smoke else Plan(5, 5, 1)


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


def trainer_rss_kib() -> Dict[str, int]:
    """VmRSS, RssAnon, RssFile and RssShmem of this process, KiB."""
    out: Dict[str, int] = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in _RSS_FIELDS:
                out[key] = int(rest.split()[0])
    return out


def make_loader(library: str, case: Case, batches: int, context: Optional[str] = THROUGHPUT_CONTEXT) -> Any:
    """A fresh loader of `batches` batches of `case`: shmrdv's or torch's with
    two persistent workers, or torch's in-process one (``in-process``)."""
    dataset = case.dataset(batches)
    if library == "shmrdv":
        from ..loader import DataLoader

        return DataLoader(dataset, batch_size=case.batch_size, num_workers=WORKERS, persistent_workers=True,
                          multiprocessing_context=context)
    from torch.utils.data import DataLoader as TorchLoader

    if library == "torch":
        return TorchLoader(dataset, batch_size=case.batch_size, num_workers=WORKERS, persistent_workers=True,
                           multiprocessing_context=context)
    if library == "in-process":
        return TorchLoader(dataset, batch_size=case.batch_size, num_workers=0)
    raise ValueError(f"unknown loader {library!r}; known: {', '.join(LIBRARIES)}")


def close_loader(loader: Any) -> None:
    """Stop a loader's persistent workers: shmrdv's ``close``, torch's
    iterator's shutdown (what its ``__del__`` does)."""
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    shutdown = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    gc.collect()


def child_pids() -> set:
    return {p.pid for p in multiprocessing.active_children()}


def settle(before: set) -> None:
    """Wait until the processes started since `before` (a run's workers) have exited."""
    deadline = time.monotonic() + SETTLE_S
    while child_pids() - before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"loader workers still running {SETTLE_S:.0f} s after their loader was closed: "
                               f"pids {sorted(child_pids() - before)}")
        time.sleep(0.01)


def epoch(loader: Any, case: Case, batches: int, collect: bool = True) -> Dict[str, Any]:
    """One epoch as a trainer runs it (``TRAINER_WORK``), timed: seconds, the
    trainer's CPU seconds and its RSS before, halfway and after (after a
    garbage collection, not timed, unless `collect` is False)."""
    if collect:
        gc.collect()
    rss_start = trainer_rss_kib()
    rss_mid: Optional[Dict[str, int]] = None
    cpu0, t0 = time.process_time(), time.perf_counter()
    it = iter(loader)
    k = 0
    for batch in it:  # as a training loop is written: a batch lives until the next one replaces it
        case.touch(batch, k)
        k += 1
        if k == batches // 2:
            rss_mid = trainer_rss_kib()
    batch = None
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    del it
    rss_end = trainer_rss_kib()
    if k != batches:
        raise AssertionError(f"an epoch of {case.name} gave {k} batches, not {batches}")
    return {"batches": k, "seconds": seconds, "cpu_s": cpu, "rss_kib": {"start": rss_start, "mid": rss_mid or rss_start,
                                                                        "end": rss_end}}


def throughput_run(library: str, case: Case, batches: int) -> Dict[str, Any]:
    """A fresh loader, a warm-up epoch (not counted), a timed epoch, then its
    workers stopped: the timed epoch's figures."""
    before = child_pids()
    loader = make_loader(library, case, batches)
    try:
        epoch(loader, case, batches)  # warm-up: workers started, their memory touched
        run = epoch(loader, case, batches)
    finally:
        close_loader(loader)
        settle(before)
    rss = run["rss_kib"]
    run.update(batches_per_s=batches / run["seconds"], gbps=batches * case.batch_bytes / run["seconds"] / 1e9,
               cpu_us_per_batch=run["cpu_s"] / batches * 1e6,
               rss_growth_kib=rss["end"]["VmRSS"] - rss["start"]["VmRSS"])
    return run


class FirstBatch:
    """Time to the first batch of a fresh loader with two spawned workers:
    calling it builds the loader, iterates and takes the first batch (the
    timed part); ``close`` then takes the rest of the epoch's
    ``FIRST_BATCH_ITEMS`` batches and stops the workers."""

    def __init__(self, library: str) -> None:
        if library not in ("shmrdv", "torch"):
            raise ValueError(f"the first batch is timed for shmrdv and torch, not {library!r}")
        self.library = library
        self.held: List[Any] = []
        self.before = child_pids()

    def __call__(self) -> None:
        dataset = TensorItems(FIRST_BATCH_ITEMS, 1 * MiB)
        if self.library == "shmrdv":
            from ..loader import DataLoader

            loader = DataLoader(dataset, batch_size=None, num_workers=WORKERS,
                                multiprocessing_context=FIRST_BATCH_CONTEXT)
        else:
            from torch.utils.data import DataLoader as TorchLoader

            loader = TorchLoader(dataset, batch_size=None, num_workers=WORKERS,
                                 multiprocessing_context=FIRST_BATCH_CONTEXT)
        it = iter(loader)
        batch = next(it)
        self.held = [loader, it]
        _touch_tensor(batch, 0)

    def close(self) -> None:
        held, self.held = self.held, []
        if held:
            loader, it = held
            held.clear()
            # The rest of the short epoch, untimed: stopping a worker still
            # starting up (importing torch) can abort it (torch's workers:
            # "terminate called without an active exception").
            for _batch in it:
                pass
            shutdown = getattr(it, "_shutdown_workers", None)  # torch's iterator
            if shutdown is not None:
                shutdown()
            del it  # shmrdv's iterator stops its workers when it goes
            close_loader(loader)
        settle(self.before)


def first_batch_seconds(library: str) -> float:
    first = FirstBatch(library)
    try:
        t0 = time.perf_counter()
        first()
        return time.perf_counter() - t0
    finally:
        first.close()


def _stats(values: Sequence[float]) -> Dict[str, Any]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "runs": [float(v) for v in values]}


def _summary(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    last = runs[-1]["rss_kib"]
    worst = max(runs, key=lambda r: r["rss_growth_kib"])
    return {"batches_per_s": _stats([r["batches_per_s"] for r in runs]),
            "gbps": _stats([r["gbps"] for r in runs]),
            "cpu_us_per_batch": _stats([r["cpu_us_per_batch"] for r in runs]),
            "rss_kib": {"start": last["start"], "mid": last["mid"], "end": last["end"],
                        "growth_max": worst["rss_growth_kib"],
                        "growth_runs": [r["rss_growth_kib"] for r in runs]}}


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.quiet, self.start = total, 0, quiet, time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        if not self.quiet:
            print(f"{time.monotonic() - self.start:6.1f}s [{self.done:>3}/{self.total}] {text}",
                  file=sys.stderr, flush=True)


def compare(smoke: bool = False, quiet: bool = True, cases: Sequence[Case] = CASES) -> Dict[str, Any]:
    """Every case with every loader, one run at a time (never two loaders at
    once: they would share the CPUs), and the summary."""
    plan = Plan.for_mode(smoke)
    progress = _Progress(len(cases) * plan.rounds * len(LIBRARIES)
                         + 2 * (plan.first_batch_rounds + plan.first_batch_warmup), quiet)
    out: List[Dict[str, Any]] = []
    for case in cases:
        batches = case.smoke_batches if smoke else case.batches
        runs: Dict[str, List[Dict[str, Any]]] = {lib: [] for lib in LIBRARIES}
        for r in range(plan.rounds):
            order = LIBRARIES[r % len(LIBRARIES):] + LIBRARIES[:r % len(LIBRARIES)]
            for lib in order:
                run = throughput_run(lib, case, batches)
                runs[lib].append(run)
                progress.step(f"{case.name}, {lib}: {run['batches_per_s']:,.1f} batches/s, "
                              f"{run['gbps']:.2f} GB/s, trainer {run['cpu_us_per_batch']:,.0f} µs CPU/batch")
        row: Dict[str, Any] = {"case": case.name, "kind": "throughput", "batch_bytes": case.batch_bytes,
                               "batch_size": case.batch_size, "batches": batches, "workers": WORKERS,
                               "context": THROUGHPUT_CONTEXT}
        for lib in LIBRARIES:
            row[lib] = _summary(runs[lib])
        ours = row["shmrdv"]["batches_per_s"]["median"]
        row["ratios"] = {lib: ours / row[lib]["batches_per_s"]["median"] for lib in ("torch", "in-process")}
        row["goals"] = dict(case.goals)
        out.append(row)
    times: Dict[str, List[float]] = {"shmrdv": [], "torch": []}
    for r in range(plan.first_batch_warmup + plan.first_batch_rounds):
        for lib in (("shmrdv", "torch") if r % 2 == 0 else ("torch", "shmrdv")):
            seconds = first_batch_seconds(lib)
            counted = r >= plan.first_batch_warmup
            if counted:
                times[lib].append(seconds)
            progress.step(f"first batch, {lib}, 2 spawn workers: {seconds * 1e3:,.0f} ms"
                          + ("" if counted else " (warm-up, not counted)"))
    first = {"case": "first batch", "kind": "first_batch", "context": FIRST_BATCH_CONTEXT, "workers": WORKERS,
             "batch_bytes": 1 * MiB, "shmrdv": {"seconds": _stats(times["shmrdv"])},
             "torch": {"seconds": _stats(times["torch"])}}
    first["ratios"] = {"torch": first["torch"]["seconds"]["median"] / first["shmrdv"]["seconds"]["median"]}
    first["goals"] = {"torch": 1.0}
    out.append(first)
    return {"bench": "loader", "smoke": smoke, "rounds": plan.rounds, "first_batch_rounds": plan.first_batch_rounds,
            "trainer_work": TRAINER_WORK, "rss_budget_kib": RSS_BUDGET_KIB, "shm_size": DEFAULT_SHM_SIZE,
            "cases": out}


def goals(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each goal with what this run measured: the ratios (shmrdv ÷ the other's
    batches/s; torch's ÷ shmrdv's time to the first batch) and shmrdv's
    trainer RSS growth."""
    found = []
    for row in results["cases"]:
        for lib, goal in row["goals"].items():
            ratio = row["ratios"][lib]
            what = ("time to first batch, torch ÷ shmrdv" if row["kind"] == "first_batch"
                    else f"{row['case']}: shmrdv ÷ {LABEL[lib]}, batches/s")
            found.append({"goal": what, "value": ratio, "target": f"≥ {goal:g}×", "met": ratio >= goal})
        if row["kind"] == "throughput":
            growth = row["shmrdv"]["rss_kib"]["growth_max"]
            found.append({"goal": f"{row['case']}: shmrdv trainer VmRSS growth over an epoch (worst round)",
                          "value": growth, "target": f"≤ {results['rss_budget_kib'] // 1024} MiB",
                          "met": growth <= results["rss_budget_kib"]})
    return found


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    return f"{nbytes / MiB:.3g} MiB"


def _rate(s: Dict[str, Any]) -> str:
    fmt = (lambda v: f"{v:,.0f}") if s["median"] >= 100 else (lambda v: f"{v:.3g}")
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _mib(kib: int) -> str:
    return f"{kib / 1024:,.0f}"


def _growth(kib: int) -> str:
    return f"{kib:+,} KiB" if abs(kib) < 10 * 1024 else f"{kib / 1024:+,.1f} MiB"


def markdown(results: Dict[str, Any]) -> str:
    """The tables: batches/s and GB/s with ranges and ratios; the trainer's CPU
    and RSS; the time to the first batch."""
    rows = [r for r in results["cases"] if r["kind"] == "throughput"]
    lines = ["| case | batch | " + " | ".join(f"{LABEL[lib]}, batches/s" for lib in LIBRARIES)
             + " | GB/s: in-process / torch / shmrdv | shmrdv ÷ torch | shmrdv ÷ in-process |",
             "|---|---:|" + "---:|" * len(LIBRARIES) + "---:|---:|---:|"]
    for r in rows:
        gbps = " / ".join(f"{r[lib]['gbps']['median']:.2f}" for lib in LIBRARIES)
        lines.append(f"| {r['case']} | {_size(r['batch_bytes'])} | "
                     + " | ".join(_rate(r[lib]["batches_per_s"]) for lib in LIBRARIES)
                     + f" | {gbps} | {r['ratios']['torch']:.2f}× | {r['ratios']['in-process']:.2f}× |")
    lines += ["", "| case | trainer CPU µs/batch: " + " / ".join(LIBRARIES)
              + " | trainer VmRSS MiB, start → end (worst growth): in-process | torch | shmrdv |",
              "|---|---:|---:|---:|---:|"]
    for r in rows:
        cpu = " / ".join(f"{r[lib]['cpu_us_per_batch']['median']:,.0f}" for lib in LIBRARIES)
        rss = [f"{_mib(r[lib]['rss_kib']['start']['VmRSS'])} → {_mib(r[lib]['rss_kib']['end']['VmRSS'])} "
               f"({_growth(r[lib]['rss_kib']['growth_max'])})" for lib in LIBRARIES]
        lines.append(f"| {r['case']} | {cpu} | " + " | ".join(rss) + " |")
    first = next((r for r in results["cases"] if r["kind"] == "first_batch"), None)
    if first:
        ms = {lib: {k: v * 1e3 for k, v in first[lib]["seconds"].items() if k != "runs"} for lib in ("torch", "shmrdv")}
        lines += ["", f"| time to first batch, {first['workers']} {first['context']} workers, median (range) | "
                  "torch DataLoader | shmrdv.loader | torch ÷ shmrdv |", "|---|---:|---:|---:|",
                  f"| construction + iter() + next() | {_rate(ms['torch'])} ms | {_rate(ms['shmrdv'])} ms | "
                  f"{first['ratios']['torch']:.2f}× |"]
    return "\n".join(lines)


def report(results: Dict[str, Any]) -> str:
    """What the command prints: a heading, the tables, the goals and the machine."""
    m = results.get("machine", {})
    rounds = results["rounds"]
    head = [f"DataLoader: shmrdv.loader vs torch's, {WORKERS} workers, median (range) over "
            f"{rounds} round{'' if rounds == 1 else 's'}" + (" (smoke run: the figures mean nothing)" if results.get("smoke") else ""),
            f"Per batch the trainer {results['trainer_work']}. Throughput: one epoch after a warm-up epoch, "
            f"persistent {THROUGHPUT_CONTEXT} workers; CPU: the trainer process only (not its workers); "
            f"RSS: VmRSS = RssAnon + RssFile + RssShmem before and after the timed epoch (shmrdv's holds the "
            f"pages it has read of its arena, {results.get('shm_size', DEFAULT_SHM_SIZE) >> 20} MiB of shared "
            f"memory mapped once).", ""]
    lines = [markdown(results), "", "Goals:"]
    for g in goals(results):
        value = f"{g['value']:.2f}×" if "×" in g["target"] else _growth(g["value"])
        lines.append(f"  {'met ' if g['met'] else 'MISS'} {g['goal']}: {value} (goal {g['target']})")
    lines += ["", f"{m.get('cpu')}, {m.get('cpus')} CPUs, Linux {m.get('kernel')}, Python {m.get('python')}, "
              f"torch {results.get('torch')} ({results.get('torch_threads')} intra-op threads in the trainer), "
              f"{results.get('date')}; {results.get('seconds', 0):.0f} s. Ratios are comparable within this run only."]
    return "\n".join(head + lines)


def plot(results: Dict[str, Any], path: str) -> None:
    """Bars of batches/s per case, one per loader, the range as error bars;
    a log scale when the cases differ by more than 20x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["cases"] if r["kind"] == "throughput"]
    colors = {"in-process": "tab:gray", "torch": "tab:blue", "shmrdv": "tab:red"}
    fig, ax = plt.subplots(figsize=(max(9, 1.6 * len(rows)), 4.8))
    width = 0.8 / len(LIBRARIES)
    medians = []
    for k, lib in enumerate(LIBRARIES):
        stats = [r[lib]["batches_per_s"] for r in rows]
        xs = [i + (k - (len(LIBRARIES) - 1) / 2) * width for i in range(len(rows))]
        med = [s["median"] for s in stats]
        medians += med
        ax.bar(xs, med, width, label=LABEL[lib], color=colors[lib],
               yerr=[[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]], capsize=3)
        if lib == "shmrdv":
            for x, r, m in zip(xs, rows, med):
                ax.annotate(f"{r['ratios']['torch']:.1f}× torch", (x, m), textcoords="offset points", xytext=(0, 4),
                            ha="center", fontsize=8)
    if medians and min(medians) > 0 and max(medians) / min(medians) > 20:
        ax.set_yscale("log")
        ax.set_ylim(min(medians) / 3, max(medians) * 2)  # room for the ratios above the bars
        ax.set_ylabel("batches/s (log), median and range")
    else:
        ax.set_ylim(0, max(medians or [1]) * 1.2)
        ax.set_ylabel("batches/s, median and range")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{textwrap.fill(r['case'], 14)}\n({_size(r['batch_bytes'])} per batch)" for r in rows],
                       fontsize=9)
    m = results.get("machine", {})
    ax.set_title(f"DataLoader throughput, {WORKERS} workers (higher is better)\n{m.get('cpu')}, {m.get('cpus')} CPUs, "
                 f"torch {results.get('torch')}" + (" — smoke run" if results.get("smoke") else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper right")  # inside: below the axis, long case names ran into it
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def _load(path: str) -> Dict[str, Any]:
    try:
        with open(path) as saved:
            results = json.load(saved)
    except (OSError, ValueError) as exc:
        raise OptionsError(f"--from-json {path}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(results, dict) or results.get("bench") != "loader":
        raise OptionsError(f"--from-json {path} is not the JSON of shmrdv bench --loader --json")
    return results


def run_command(args: Any) -> int:
    """``shmrdv bench --loader``: measure (or load --from-json), print the
    tables and the goals, save --json and --plot."""
    if args.from_json:
        results = _load(args.from_json)
    else:
        if torch is None:
            print("skipped the loader benchmark: torch is not installed (pip install torch)")
            return 0
        # SIGTERM unwinds like Ctrl-C: the workers are stopped and the arenas unlinked.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        start = time.monotonic()
        try:
            results = compare(smoke=args.smoke, quiet=args.quiet)
        except (AssertionError, RuntimeError, TimeoutError, EOFError, OSError) as exc:
            text = str(exc).strip().splitlines()
            raise MeasurementFailed(f"measuring the loaders failed: {type(exc).__name__}: "
                                    f"{text[0] if text else ''}") from exc
        results.update(machine=machine(), date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                       torch_threads=torch.get_num_threads(), seconds=time.monotonic() - start)
        results["goals"] = goals(results)
    print(report(results))
    write_outputs(results, args, plot)
    return 0


__all__ = ["CASES", "FirstBatch", "Images", "PartlyRandomItems", "RandomItems", "TensorItems", "compare", "epoch", "first_batch_seconds", "goals",
           "make_loader", "markdown", "plot", "report", "run_command", "throughput_run"]
