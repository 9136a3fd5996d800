"""The ``shmrdv bench`` command: plan, progress, results, Markdown tables, plot."""

from __future__ import annotations
import argparse
import importlib.util
import json
import os
import queue
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..group import MAX_RANKS
from . import mpi_p2p
from .common import CHILD_LIFETIME_S, KiB, MiB, ROUND_TRIP_SIZES, SIZES, human_size, parse_size
from .errors import MeasurementFailed, OptionsError
from .machine import machine
from .measure import held_views_memory, keys_scaling, process_scaling, round_trip_row, throughput_row, timed_round_trips, timed_stream
from .processes import ChildFailed, Placement, allowed_cpus, pinned, placement, sweep_segments, untold_failure
from .transports import PEERS, TRANSPORTS, open_peer

# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


@dataclass
class Plan:
    """What one ``shmrdv bench`` run measures."""

    mode: str
    sizes: List[int]
    stream_s: float  # target length of each timed stream
    round_trip_s: float
    max_round_trips: int
    round_trip_warmup: int
    pairs: List[int]
    pairs_messages: int
    pending_keys: List[int]
    keys_messages: int
    rss_sizes: List[int]
    rss_views: int
    max_stream_count: int = 10_000_000
    huge_pages: bool = False  # shmrdv's rendezvous created with huge_pages=True

    @staticmethod
    def for_mode(mode: str) -> "Plan":
        if mode == "full":
            return Plan("full", SIZES, 1.0, 1.0, 20_000, 500, [1, 2, 4], 20_000,
                        [0, 100, 10_000, 100_000], 20_000, [4 * KiB, 1 * MiB, 16 * MiB, 64 * MiB], 8)
        if mode == "quick":
            return Plan("quick", SIZES[:-1], 0.15, 0.15, 3_000, 100, [1, 2], 5_000,
                        [0, 100_000], 10_000, [64 * KiB, 16 * MiB], 8)
        if mode == "smoke":
            return Plan("smoke", [64, 4 * KiB, 1 * MiB], 0.005, 0.005, 20, 5, [1, 2], 50,
                        [0, 1_000], 50, [64 * KiB], 2, max_stream_count=50)
        raise ValueError(mode)


class Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done, self.quiet, self.start = total, 0, quiet, time.monotonic()

    def step(self, text: str) -> None:
        self.done += 1
        self.say(f"[{self.done:>3}/{self.total}] {text}")

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"{time.monotonic() - self.start:6.1f}s {text}", file=sys.stderr, flush=True)


@dataclass
class Results:
    machine: Dict[str, Any]
    command: str
    mode: str
    skipped: Dict[str, str] = field(default_factory=dict)
    throughput: List[Dict[str, Any]] = field(default_factory=list)
    round_trip: List[Dict[str, Any]] = field(default_factory=list)
    processes: List[Dict[str, Any]] = field(default_factory=list)
    keys: List[Dict[str, Any]] = field(default_factory=list)
    held_views: List[Dict[str, Any]] = field(default_factory=list)
    targets: List[Dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    huge_pages: bool = False

    def gbps(self, transport: str, nbytes: int) -> Optional[float]:
        for row in self.throughput:
            if row["transport"] == transport and row["bytes"] == nbytes:
                return float(row["gbps"])
        return None

    def rtt(self, transport: str, placement_name: str, nbytes: int) -> Optional[Dict[str, Any]]:
        for row in self.round_trip:
            if (row["transport"], row["placement"], row["bytes"]) == (transport, placement_name, nbytes):
                return row
        return None


def _placements() -> List[Placement]:
    """"apart" and "same", or only "same" on one CPU; call before pinning anything."""
    return [placement(name) for name in ("apart", "same") if name == "same" or len(allowed_cpus()) > 1]


def _record_throughput(results: Results, progress: Progress, label: str, row: Dict[str, Any]) -> None:
    results.throughput.append(row)
    progress.step(f"{label:<22} {human_size(row['bytes']):>8} one-way: {row['gbps']:8.3f} GB/s "
                  f"{row['msgs_per_s']:>11,.0f} msg/s")


def _record_round_trip(results: Results, progress: Progress, label: str, row: Dict[str, Any]) -> None:
    results.round_trip.append(row)
    progress.step(f"{label:<22} {human_size(row['bytes']):>8} round trip, {row['placement']}: "
                  f"median {row['median_us']:7.1f} us, p99 {row['p99_us']:7.1f} us")


def _measure_mpi(plan: Plan, results: Results, progress: Progress) -> None:
    """Open MPI's point to point: its streams pinned apart and its round trips
    in each placement, in one mpirun per placement (``mpi_p2p``)."""
    label = TRANSPORTS["mpi"].label
    trips = [(nbytes, plan.round_trip_s, plan.max_round_trips, plan.round_trip_warmup) for nbytes in ROUND_TRIP_SIZES]
    for index, where in enumerate(_placements()):
        streams = [(nbytes, plan.stream_s, plan.max_stream_count) for nbytes in plan.sizes] if index == 0 else []
        out = mpi_p2p.run(where.name, (where.parent_cpu, where.child_cpu), streams, trips)
        for row in out["stream"]:
            _record_throughput(results, progress, label,
                               throughput_row("mpi", where.name, row["bytes"], row["messages"], row["seconds"]))
        for row in out["round_trip"]:
            _record_round_trip(results, progress, label, round_trip_row("mpi", where.name, row["bytes"], row["times_s"]))


def _measure_transport(name: str, plan: Plan, results: Results, progress: Progress, lifetime_s: int) -> None:
    transport = TRANSPORTS[name]
    if name == "mpi":
        _measure_mpi(plan, results, progress)
        return
    placements = _placements()
    where = placements[0]
    with pinned(where.parent_cpu), open_peer(name, where.child_cpu, lifetime_s) as peer:
        for nbytes in (n for n in plan.sizes if transport.measures(n)):
            peer.resize(nbytes, huge_pages=plan.huge_pages)
            count, seconds = timed_stream(peer, plan.stream_s, plan.max_stream_count)
            _record_throughput(results, progress, transport.label, throughput_row(name, where.name, nbytes, count, seconds))
        if not transport.round_trip:
            return
        for where in placements:
            placement_name = where.name
            peer.pin_child(where.child_cpu)
            with pinned(where.parent_cpu):
                for nbytes in ROUND_TRIP_SIZES:
                    peer.resize(nbytes, huge_pages=plan.huge_pages)
                    times = timed_round_trips(peer, plan.round_trip_s, plan.max_round_trips, plan.round_trip_warmup)
                    _record_round_trip(results, progress, transport.label,
                                       round_trip_row(name, placement_name, nbytes, times))


def _measure_growth(plan: Plan, results: Results, progress: Progress, lifetime_s: int) -> None:
    for pairs in plan.pairs:
        row = process_scaling(pairs, 64 * KiB, plan.pairs_messages, lifetime_s)
        results.processes.append(row)
        progress.step(f"shmrdv {pairs} producer(s) + {pairs} consumer(s), 64 KiB: {row['gbps']:.2f} GB/s total "
                      f"({row['msgs_per_s']:,.0f} msg/s)")
    where = _placements()[0]
    with pinned(where.parent_cpu), open_peer("shmrdv", where.child_cpu, lifetime_s) as peer:
        for pending in plan.pending_keys:
            row = keys_scaling(peer, pending, 4 * KiB, plan.keys_messages, 3)
            results.keys.append(row)
            progress.step(f"shmrdv 4 KiB send/recv with {pending:>7,} pending keys: {row['gbps']:.3f} GB/s "
                          f"({row['msgs_per_s']:,.0f} msg/s)")
        for nbytes in plan.rss_sizes:
            row = held_views_memory(peer, nbytes, plan.rss_views)
            results.held_views.append(row)
            progress.step(f"shmrdv receiver holding {plan.rss_views} x {human_size(nbytes)}: RssAnon "
                          f"{row['rss_anon_growth_kib']:+,} KiB, RssShmem {row['rss_shmem_growth_kib']:+,} KiB")


def _best_peer_gbps(results: Results, nbytes: int) -> Tuple[Optional[str], Optional[float]]:
    figures = [(results.gbps(p, nbytes), p) for p in PEERS]
    measured = [(g, p) for g, p in figures if g is not None]
    if not measured:
        return None, None
    gbps, name = max(measured)
    return name, gbps


def _best_peer_rtt(results: Results, placement_name: str, nbytes: int) -> Optional[Dict[str, Any]]:
    rows = [results.rtt(p, placement_name, nbytes) for p in PEERS]
    measured = [r for r in rows if r is not None]
    return min(measured, key=lambda r: r["median_us"]) if measured else None


def evaluate_targets(results: Results) -> List[Dict[str, Any]]:
    """The issue's targets, each with the figures it was judged on."""
    targets: List[Dict[str, Any]] = []

    def add(what: str, ratio: Optional[float], goal: float, detail: str) -> None:
        targets.append({"target": what, "ratio": ratio, "goal": goal,
                        "met": None if ratio is None else ratio >= goal, "detail": detail})

    for placement_name in ("apart", "same"):
        ours, best = results.rtt("shmrdv", placement_name, 64), results.rtt("pipe", placement_name, 64)
        if ours and best:
            add(f"64 B round trip, {placement_name}: mp.Pipe / shmrdv (median)", best["median_us"] / ours["median_us"],
                5.0 if placement_name == "apart" else 2.0,
                f"shmrdv {ours['median_us']:.1f} us (p99 {ours['p99_us']:.1f}) vs {best['label']} "
                f"{best['median_us']:.1f} us (p99 {best['p99_us']:.1f}); p99 ratio {best['p99_us'] / ours['p99_us']:.2f}x")
    for ways, peer_name, goal in ((("shmrdv-many",), "pipe", 5.0), (("shmrdv-many",), "faster-fifo", 2.0)):
        for way in ways:
            ours_gbps, theirs = results.gbps(way, 4 * KiB), results.gbps(peer_name, 4 * KiB)
            if ours_gbps and theirs:
                add(f"4 KiB streaming, {TRANSPORTS[way].label}: x {TRANSPORTS[peer_name].label}", ours_gbps / theirs,
                    goal, f"{ours_gbps:.3f} vs {theirs:.3f} GB/s")
    for placement_name in ("apart", "same"):
        ours, mpi = results.rtt("shmrdv", placement_name, 64), results.rtt("mpi", placement_name, 64)
        if ours and mpi:
            add(f"64 B round trip, {placement_name}: Open MPI / shmrdv (median)", mpi["median_us"] / ours["median_us"],
                1.0 if placement_name == "apart" else 1 / 1.5,
                f"shmrdv {ours['median_us']:.1f} us vs Open MPI {mpi['median_us']:.1f} us; "
                f"shmrdv p99/median {ours['p99_us'] / ours['median_us']:.2f}")
    peer, peer_gbps = _best_peer_gbps(results, 4 * KiB)
    for way in ("shmrdv", "shmrdv-alloc"):
        ours_gbps = results.gbps(way, 4 * KiB)
        if ours_gbps and peer_gbps and peer:
            add(f"4 KiB streaming, {TRANSPORTS[way].label}: x best peer", ours_gbps / peer_gbps, 5.0,
                f"{ours_gbps:.3f} vs {TRANSPORTS[peer].label} {peer_gbps:.3f} GB/s")
    for nbytes in (n for n in SIZES if n >= 16 * MiB):
        limit = results.gbps("copyto", nbytes)
        for way, goal in (("shmrdv", 0.9), ("shmrdv-alloc", 10.0)):
            ours_gbps = results.gbps(way, nbytes)
            if limit and ours_gbps:
                add(f"{human_size(nbytes)} {TRANSPORTS[way].label}: x np.copyto", ours_gbps / limit, goal,
                    f"{ours_gbps:.2f} vs {limit:.2f} GB/s")
    one = next((r for r in results.keys if r["pending_keys"] == 0), None)
    for row in results.keys:
        if one and row["pending_keys"] == max(r["pending_keys"] for r in results.keys) and row["pending_keys"]:
            add(f"{row['pending_keys']:,} pending keys: send/recv vs one key", row["gbps"] / one["gbps"], 0.5,
                f"{row['gbps']:.3f} vs {one['gbps']:.3f} GB/s (4 KiB)")
    return targets


def _gbps_cell(value: Optional[float], msgs: Optional[float], nbytes: int) -> str:
    if value is None:
        return "—"
    text = f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    if nbytes <= 64 * KiB and msgs is not None:
        text += f" ({msgs / 1e3:,.0f}k/s)" if msgs < 1e6 else f" ({msgs / 1e6:.2f}M/s)"
    return text


def markdown(results: Results) -> str:
    """The run as Markdown tables, ratios against each peer."""
    names = [n for n in TRANSPORTS if any(r["transport"] == n for r in results.throughput)]
    peers = [n for n in PEERS if n in names]
    sizes = sorted({r["bytes"] for r in results.throughput})
    pages = " (shmrdv on huge pages)" if results.huge_pages else ""
    lines = [f"### One-way throughput, GB/s (messages/s up to 64 KiB), producer and consumer pinned apart{pages}", "",
             "| size | " + " | ".join(TRANSPORTS[n].label for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    for nbytes in sizes:
        cells = []
        for n in names:
            row = next((r for r in results.throughput if r["transport"] == n and r["bytes"] == nbytes), None)
            cells.append(_gbps_cell(row["gbps"] if row else None, row["msgs_per_s"] if row else None, nbytes))
        lines.append(f"| {human_size(nbytes)} | " + " | ".join(cells) + " |")
    if peers and "shmrdv" in names:
        lines += ["", "### shmrdv send/recv (alloc/recv) throughput ÷ each peer's, same run", "",
                  "| size | " + " | ".join(TRANSPORTS[n].label for n in peers + ["copyto"] if n in names) + " |",
                  "|---|" + "---:|" * len([n for n in peers + ["copyto"] if n in names])]
        for nbytes in sizes:
            cells = []
            for n in peers + ["copyto"]:
                if n not in names:
                    continue
                theirs, ours, alloc = results.gbps(n, nbytes), results.gbps("shmrdv", nbytes), results.gbps("shmrdv-alloc", nbytes)
                if not theirs or not ours:
                    cells.append("—")
                    continue
                cells.append(f"{ours / theirs:.2g}x" + (f" ({alloc / theirs:,.3g}x)" if alloc else ""))
            lines.append(f"| {human_size(nbytes)} | " + " | ".join(cells) + " |")
    if results.round_trip:
        rt_names = [n for n in TRANSPORTS if any(r["transport"] == n for r in results.round_trip)]
        lines += ["", "### Round trip, median / p99 µs (apart: two CPUs; same: one CPU)", "",
                  "| size, placement | " + " | ".join(TRANSPORTS[n].label for n in rt_names) + " | best peer ÷ shmrdv (median, p99) |",
                  "|---|" + "---:|" * (len(rt_names) + 1)]
        for placement_name in ("apart", "same"):
            for nbytes in ROUND_TRIP_SIZES:
                cells = []
                for n in rt_names:
                    row = results.rtt(n, placement_name, nbytes)
                    cells.append("—" if row is None else f"{row['median_us']:.1f} / {row['p99_us']:.1f}")
                ours_rtt, best_rtt = results.rtt("shmrdv", placement_name, nbytes), _best_peer_rtt(results, placement_name, nbytes)
                ratio = (f"{best_rtt['median_us'] / ours_rtt['median_us']:.2f}x, {best_rtt['p99_us'] / ours_rtt['p99_us']:.2f}x "
                         f"({best_rtt['label']})") if ours_rtt and best_rtt else "—"
                if any(c != "—" for c in cells):
                    lines.append(f"| {human_size(nbytes)}, {placement_name} | " + " | ".join(cells) + f" | {ratio} |")
    if results.processes:
        lines += ["", "### shmrdv cost growth", "", "| producers + consumers (64 KiB, own key each) | GB/s total | messages/s |",
                  "|---|---:|---:|"]
        lines += [f"| {r['pairs']} + {r['pairs']} | {r['gbps']:.2f} | {r['msgs_per_s']:,.0f} |" for r in results.processes]
    if results.keys:
        lines += ["", "| pending keys (4 KiB send/recv, apart) | GB/s | messages/s | vs one key |", "|---:|---:|---:|---:|"]
        one = next((r for r in results.keys if r["pending_keys"] == 0), results.keys[0])
        lines += [f"| {r['pending_keys']:,} | {r['gbps']:.3f} | {r['msgs_per_s']:,.0f} | {r['gbps'] / one['gbps']:.2f}x |"
                  for r in results.keys]
    if results.held_views:
        lines += ["", "| receiver holds (every byte read) | RssAnon growth | RssShmem growth (mapped shared pages) |",
                  "|---|---:|---:|"]
        lines += [f"| {r['views']} x {human_size(r['bytes'])} = {human_size(r['held_bytes'])} | "
                  f"{r['rss_anon_growth_kib']:+,} KiB | {r['rss_shmem_growth_kib']:+,} KiB |" for r in results.held_views]
    if results.targets:
        lines += ["", "### Targets", ""]
        if results.mode == "smoke":
            lines += [SMOKE_NOTE, ""]
        lines += ["| target | ratio | goal | met | figures |", "|---|---:|---:|---|---|"]
        for t in results.targets:
            met = "—" if not t["goal"] else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['target']} | {t['ratio']:.2f}x | {'≥ %.3gx' % t['goal'] if t['goal'] else 'report'} | {met} | {t['detail']} |")
    if results.skipped:
        lines += [""] + [f"Skipped {TRANSPORTS[n].label}: {why}." for n, why in results.skipped.items()]
    return "\n".join(lines)


SMOKE_NOTE = ("A smoke run (--smoke) measures a few messages of each kind to check that everything runs: "
              "its figures, and so whether a target is met, mean nothing. Run without --smoke to measure.")


def throughput_scale(results: Results) -> Optional[Tuple[float, float]]:
    """The plot's throughput range, (lowest, top), from the copying transports
    only (see plot), or None if there are none."""
    copying = [r["gbps"] for r in results.throughput if r["transport"] != "shmrdv-alloc" and r["gbps"] > 0]
    return (min(copying) / 2, max(copying) * 2) if copying else None


def plot(results: Results, path: str) -> None:
    """Log-log throughput vs size, one line per transport."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"shmrdv": ("tab:red", "o", "-"), "shmrdv-alloc": ("tab:red", "s", "--"), "copyto": ("black", "", ":"),
              "queue": ("tab:blue", "v", "-"), "pipe": ("tab:purple", "^", "-"), "shm-ring": ("tab:green", "D", "-"),
              "zmq": ("tab:orange", "P", "-"), "torch": ("tab:gray", "X", "-"),
              "shmrdv-many": ("tab:red", "^", "-."), "faster-fifo": ("tab:brown", "*", "-"),
              "mpi": ("tab:cyan", "h", "-")}
    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    # The scale is the copying transports': alloc/recv copies nothing once a
    # message is written, so its large sizes would squeeze every other line
    # into a sliver. What lies above is drawn at the top, its figures written.
    scale = throughput_scale(results)
    top = scale[1] if scale else None
    for name in TRANSPORTS:
        rows = sorted((r for r in results.throughput if r["transport"] == name), key=lambda r: r["bytes"])
        if not rows:
            continue
        color, marker, line = styles.get(name, ("tab:olive", ".", "-"))
        gbps = [r["gbps"] if top is None else min(r["gbps"], top) for r in rows]
        axes.plot([r["bytes"] for r in rows], gbps, marker=marker, linestyle=line,
                  color=color, label=TRANSPORTS[name].label, linewidth=2 if name.startswith("shmrdv") else 1.3)
        above = [r for r in rows if top is not None and r["gbps"] > top]
        if above:
            axes.text(0.01, 0.98, f"{TRANSPORTS[name].label} off the scale (nothing copied):\n"
                      + ", ".join(f"{human_size(r['bytes'])} {r['gbps']:,.0f} GB/s" for r in above),
                      transform=axes.transAxes, ha="left", va="top", fontsize=7, color=color)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    if scale:
        axes.set_ylim(scale[0], top * 8)  # room above the top for the note
    sizes = sorted({r["bytes"] for r in results.throughput})
    axes.set_xticks(sizes, [human_size(s) for s in sizes])
    axes.set_xlabel("message size")
    axes.set_ylabel("one-way throughput, GB/s (log)")
    m = results.machine
    axes.set_title(f"float32 arrays between two processes, pinned apart\n{m.get('cpu')}, "
                   f"{m.get('cpus')} CPUs, Linux {m.get('kernel')}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def parse_sizes(text: str) -> List[int]:
    """The --sizes option: comma-separated sizes (``parse_size``), sorted, each once."""
    return sorted({parse_size(item) for item in text.split(",")})


def world_size(text: str) -> int:
    """The --world-size option: a whole number of ranks a Group can have."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_RANKS:
        raise argparse.ArgumentTypeError(f"a group has 1..{MAX_RANKS} ranks, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full", action="store_true",
                        help="every size up to 256 MiB, longer runs and every growth step (several minutes)")
    parser.add_argument("--smoke", action="store_true",
                        help="a few messages of each kind: checks that everything runs; the figures mean nothing")
    parser.add_argument("--transports", default=",".join(TRANSPORTS),
                        help="comma-separated subset of: " + ", ".join(TRANSPORTS))
    parser.add_argument("--sizes", type=parse_sizes,
                        help="comma-separated message sizes instead of the mode's: whole numbers of bytes with "
                             "an optional unit B, K, KiB, M, MiB, G or GiB (case-insensitive; K = KiB = 1024 B), "
                             "each a multiple of 4 (the arrays are float32), e.g. 64B,4KiB,16MiB")
    parser.add_argument("--no-growth", action="store_true", help="skip the cost-growth measurements")
    parser.add_argument("--json", metavar="FILE", help="write the raw figures as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a log-log plot of throughput vs size (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--from-json", metavar="FILE",
                        help="measure nothing: print the tables (and --plot) of a run saved with --json")
    parser.add_argument("--huge-pages", action="store_true",
                        help="create shmrdv's rendezvous with huge_pages=True (needs a /dev/shm that gives huge "
                             "pages: a tmpfs mounted huge=within_size, always or advise)")
    parser.add_argument("--collectives", action="store_true",
                        help="measure shmrdv.Group's collectives against Open MPI (mpi4py) and gloo instead")
    parser.add_argument("--world-size", type=world_size, default=2, metavar="N",
                        help=f"ranks of the --collectives run, 1..{MAX_RANKS} (default 2: one per CPU on a 2-CPU "
                             "machine)")
    parser.add_argument("--loader", action="store_true",
                        help="measure shmrdv.loader.DataLoader against torch's DataLoader instead (needs torch; "
                             "about two minutes, seconds with --smoke)")


def _load_results(path: str) -> Results:
    """A run saved with --json. OSError if it cannot be read; ValueError if it is not one."""
    with open(path) as saved:
        try:
            data = json.load(saved)
        except ValueError as exc:  # not JSON, or not text
            raise ValueError(f"--from-json {path} is not JSON: {str(exc).splitlines()[0]}") from exc
    try:
        return Results(**data)
    except TypeError:
        raise ValueError(f"--from-json {path} is not the JSON of shmrdv bench --json") from None


def count_steps(plan: Plan, names: List[str], growth: bool) -> int:
    """How many progress steps a run of `plan` over transports `names` has: what the loops above measure."""
    placements = len(_placements())
    steps = sum(len([s for s in plan.sizes if TRANSPORTS[n].measures(s)]) +
                (placements * len(ROUND_TRIP_SIZES) if TRANSPORTS[n].round_trip else 0) for n in names)
    if growth and "shmrdv" in names:
        steps += len(plan.pairs) + len(plan.pending_keys) + len(plan.rss_sizes)
    return steps


def _reason(exc: BaseException) -> str:
    """Why a measurement failed, in one line: the child failure behind a symptom
    (an EOF, a timeout) if there was one, else the error itself."""
    failure = untold_failure()
    if failure is not None and not isinstance(exc, ChildFailed):
        exc = failure
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# A measurement that fails (a child died, a message did not come or came wrong) ends the run in one line.
_MEASUREMENT_FAILURES = (AssertionError, TimeoutError, EOFError, queue.Empty)


def run(args: argparse.Namespace) -> int:
    if args.full and args.smoke:
        raise OptionsError("--full and --smoke exclude each other")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise OptionsError("--plot needs matplotlib: pip install 'shmrdv[bench]' (or pip install matplotlib)")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.access(folder, os.W_OK):  # found out now, not after the measurements
            raise OptionsError(f"{option} {path}: cannot write in {folder}")
    if args.collectives and args.loader:
        raise OptionsError("--collectives and --loader exclude each other")
    if args.collectives:
        from .collectives import run_command

        return run_command(args)
    if args.loader:
        from .loader import run_command as run_loader

        return run_loader(args)
    if args.from_json:
        results = _load_results(args.from_json)
        print(markdown(results))
        if args.plot:
            plot(results, args.plot)
        return 0
    plan = Plan.for_mode("full" if args.full else "smoke" if args.smoke else "quick")
    if args.sizes:
        plan.sizes = list(args.sizes)
    if args.huge_pages:
        from ..huge_pages import offered

        offer = offered()
        if not offer.available:
            raise OptionsError(f"--huge-pages: {offer.why}")
        plan.huge_pages = True
    wanted = [n.strip() for n in args.transports.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in TRANSPORTS]
    if unknown:
        raise OptionsError(f"unknown transport(s) {', '.join(unknown)}; known: {', '.join(TRANSPORTS)}")
    if not wanted:
        raise OptionsError(f"--transports names none; known: {', '.join(TRANSPORTS)}")
    results = Results(machine=machine(), command="shmrdv bench " + " ".join(sys.argv[2:] if len(sys.argv) > 1 else []),
                      mode=plan.mode, huge_pages=plan.huge_pages)
    names = []
    for name in (n for n in TRANSPORTS if n in wanted):
        why = TRANSPORTS[name].missing()
        if why:
            results.skipped[name] = why
        else:
            names.append(name)
    if not names:
        raise MeasurementFailed("nothing to measure: " + "; ".join(
            f"{TRANSPORTS[n].label}: {why}" for n, why in results.skipped.items()))
    for name, why in results.skipped.items():
        print(f"skipping {TRANSPORTS[name].label}: {why}", file=sys.stderr)
    progress = Progress(count_steps(plan, names, not args.no_growth), args.quiet)
    m = results.machine
    progress.say(f"shmrdv bench ({plan.mode}): {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}; "
                 f"{len(names)} transports, sizes {', '.join(human_size(s) for s in plan.sizes)}")
    lifetime = CHILD_LIFETIME_S * (3 if plan.mode == "full" else 1)
    # SIGTERM unwinds like Ctrl-C: children are stopped and every segment unlinked.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    try:
        for name in names:
            try:
                _measure_transport(name, plan, results, progress, lifetime)
            except _MEASUREMENT_FAILURES as exc:
                raise MeasurementFailed(f"measuring {TRANSPORTS[name].label} failed: {_reason(exc)}") from exc
        if not args.no_growth and "shmrdv" in names:
            try:
                _measure_growth(plan, results, progress, lifetime)
            except _MEASUREMENT_FAILURES as exc:
                raise MeasurementFailed(f"measuring shmrdv cost growth failed: {_reason(exc)}") from exc
    finally:
        leftovers = sweep_segments()
        if leftovers:
            print(f"warning: unlinked {len(leftovers)} leftover segment(s): {leftovers}", file=sys.stderr)
    results.seconds = time.monotonic() - start
    results.targets = evaluate_targets(results)
    print(markdown(results))
    print(f"\n{m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}, Python {m['python']}, numpy {m['numpy']}; "
          f"{results.seconds:.0f} s. Ratios are comparable within this run only.")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(asdict(results), out, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0
