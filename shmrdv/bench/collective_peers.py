"""What shmrdv's collectives are compared against: Open MPI (through mpi4py)
and torch.distributed's gloo backend, measured on the same cases.

A comparison is only fair when both sides run the same operations on the
same data with the same placement, so the cases are data (``OPS``) and each
peer runs all of them in one launch: ``run_mpi`` under ``mpirun``,
``run_gloo`` in spawned processes. Both return
``{case name: {"median_us", "p99_us", "iters", "nbytes"}}``, or None after
printing ``skipped <peer>: <why>`` when the peer is not installed, so a
benchmark run on a machine without Open MPI or torch still reports shmrdv.

How a case is timed, by both peers alike: a check call whose result is
verified, warmup calls, one barrier so that the ranks start together, then
``iters`` consecutive calls with no barrier between them, each timed on its
own with ``time.perf_counter_ns``. A call's time is the *slowest rank's*
time for that iteration (the maximum over ranks, iteration by iteration),
since a collective is done only when its last rank is; median and p99 are
taken over those maxima, in microseconds.

Nothing outlives a run: every launch has a timeout after which it and all
its descendants are killed, each rank also has its own alarm, and Open MPI
keeps its shared-memory segments and session files in a private directory,
``/dev/shm/shmrdv-mpi-<pid>-*``, removed afterwards, also when mpirun had to
be killed; one left by a run that was itself killed is removed by the next.

This module imports only the standard library and numpy; mpi4py and torch
are imported by the rank processes (and torch by ``run_gloo`` to see
whether gloo is there).
"""

from __future__ import annotations
import contextlib
import glob
import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..units import human_bytes
from .cleanup import alive, descendants, stop_processes
from .processes import SINGLE_THREADED_MATH, BenchmarkFailed, environment

KiB = 1024
MiB = 1024 * KiB
ITEM = 4  # float32

# (op, nbytes): nbytes is what one rank sends (allreduce, broadcast) or, for
# allgather, the whole output, of which each rank contributes nbytes / world_size.
OPS: Tuple[Tuple[str, int], ...] = (
    ("allreduce", 4 * KiB),
    ("allreduce", 1 * MiB),
    ("allreduce", 16 * MiB),
    ("allreduce", 64 * MiB),
    ("broadcast", 16 * MiB),
    ("allgather", 16 * MiB),
    ("barrier", 0),
)

# A case's time budget, and each peer's guessed cost of a call that turns it
# into an iteration count: (latency s, bytes/s), pessimistic on purpose, so a
# case stays within about a second even on a busy 2-CPU machine.
BUDGET_S = 1.0
MPI_COST = (10e-6, 0.5e9)
GLOO_COST = (4e-3, 0.25e9)
MIN_ITERS, MAX_ITERS = 5, 2000

# Smoke mode checks the plumbing, not the numbers: a few calls on small arrays.
SMOKE_ITERS = 2
SMOKE_MAX_BYTES = 64 * KiB

TIMEOUT_S = 180.0
# Without these, numpy's OpenBLAS and torch's OpenMP start threads that spin
# on the CPU the rank is pinned to.
_MARK = "collective_peers"


def case_name(op: str, nbytes: int) -> str:
    """``"allreduce 16 MiB"``; ``"barrier"`` for a case without data."""
    return op if op == "barrier" else f"{op} {human_bytes(nbytes)}"


def iterations(op: str, nbytes: int, cost: Tuple[float, float], budget_s: float = BUDGET_S) -> int:
    """Calls that fit in `budget_s` when one costs `cost` = (latency s, bytes/s)
    (every op is counted as moving `nbytes` once: a guess, not a model)."""
    latency_s, bytes_per_s = cost
    per_call = latency_s + nbytes / bytes_per_s
    return max(MIN_ITERS, min(MAX_ITERS, int(budget_s / per_call)))


def warmups(iters: int) -> int:
    """Untimed calls before the timed ones: a tenth of them, 1 to 50."""
    return max(1, min(50, iters // 10))


def _plan(cases: Sequence[Tuple[str, int]], world_size: int, iters_for: Optional[Callable[[str, int], int]],
          smoke: bool, cost: Tuple[float, float]) -> List[List[Any]]:
    """[name, op, nbytes, iters, warmup] per case, as the rank processes take them."""
    plan = []
    for op, nbytes in cases:
        measured = min(nbytes, SMOKE_MAX_BYTES) if smoke else nbytes
        if op == "allgather" and measured % (ITEM * world_size):
            raise ValueError(f"allgather of {nbytes} bytes does not split into {world_size} float32 parts")
        if measured % ITEM:
            raise ValueError(f"{op} of {nbytes} bytes is not a whole number of float32")
        if iters_for is not None:
            iters = int(iters_for(op, measured))
        else:
            iters = SMOKE_ITERS if smoke else iterations(op, measured, cost)
        if iters < 1:
            raise ValueError(f"iters_for({op!r}, {measured}) gave {iters}: at least 1 call is needed")
        plan.append([case_name(op, nbytes), op, measured, iters, 1 if smoke else warmups(iters)])
    return plan


# ---------------------------------------------------------------------------
# What the rank processes of both peers share
# ---------------------------------------------------------------------------


def time_calls(call: Callable[[], Any], iters: int, warmup: int, barrier: Callable[[], Any]) -> List[int]:
    """`warmup` untimed calls, one barrier, then `iters` calls each timed on its own (ns)."""
    for _ in range(warmup):
        call()
    barrier()
    times = [0] * iters
    clock = time.perf_counter_ns
    for i in range(iters):
        start = clock()
        call()
        times[i] = clock() - start
    return times


def expect(what: str, got: Any, wanted: Any) -> None:
    """Fail unless `got` is `wanted` (broadcast, as numpy does): a peer that computes
    something else is measuring something else."""
    values = np.asarray(got, dtype=np.float64)
    if not np.all(values == np.asarray(wanted, dtype=np.float64)):
        raise BenchmarkFailed(f"{what}: got {values.tolist()}, expected {np.asarray(wanted).tolist()}")


def summarize(per_rank_ns: Sequence[Sequence[int]], nbytes: int) -> Dict[str, Any]:
    """Median and p99 (us) of each iteration's slowest rank."""
    worst = np.asarray(per_rank_ns, dtype=np.float64).max(axis=0) / 1000.0
    return {"median_us": float(np.median(worst)), "p99_us": float(np.percentile(worst, 99)),
            "iters": int(worst.size), "nbytes": nbytes}


def run_rank(results: Any, what: str, cpu: Optional[int], lifetime_s: int, body: Callable[[], Dict[str, Any]]) -> None:
    """The frame of every measuring rank process: an alarm that ends it
    after lifetime_s whatever happens, pinned to cpu (before anything starts
    threads), then body()'s answer, or the error that ended it, sent through
    results (a Pipe end, closed after)."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(lifetime_s)
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        results.send(body())
    except BaseException as error:
        results.send({"error": f"{what}: {type(error).__name__}: {error}\n{traceback.format_exc()}"})
        raise
    finally:
        results.close()


def _cpus() -> List[int]:
    return sorted(os.sched_getaffinity(0))


def _kill_tree(pids: List[int]) -> None:
    """SIGTERM, then SIGKILL after a grace, to `pids` and everything below them."""
    everything = list(pids)
    for pid in pids:
        everything.extend(descendants(pid))
    stop_processes(everything, grace_s=3.0)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------------------
# Open MPI
# ---------------------------------------------------------------------------


def _mpi_missing() -> Optional[str]:
    if shutil.which("mpirun") is None:
        return "mpirun is not on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


def _sweep_stale_scratch(parent: str) -> None:
    """Remove the scratch directories of earlier runs whose process is gone."""
    for path in glob.glob(os.path.join(parent, "shmrdv-mpi-*-*")):
        pid = os.path.basename(path).split("-")[2]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def mpirun_command(world_size: int, pin: bool, scratch: str) -> List[str]:
    """mpirun and its options: shared memory only (self, vader), one rank per
    core when there are enough cores for `pin`, otherwise unbound ranks that
    yield while they wait, so oversubscribed ranks do not starve each other."""
    command = ["mpirun", "--allow-run-as-root", "-np", str(world_size),
               "--mca", "btl", "self,vader",
               # segments and session files in a directory that is removed afterwards
               "--mca", "btl_vader_backing_directory", scratch,
               "--mca", "orte_tmpdir_base", scratch,
               # launcher traffic stays on loopback
               "--mca", "oob_tcp_if_include", "lo"]
    if world_size > len(_cpus()):
        command += ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    else:
        command += ["--bind-to", "core" if pin else "none"]
    return command


def _run_bounded(command: List[str], timeout_s: float, env: Dict[str, str]) -> str:
    """Run `command` in a session of its own; its stdout. Killed with all its
    descendants on timeout, on failure and on interrupt."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree([process.pid])
            out, err = process.communicate(timeout=10)
            raise BenchmarkFailed(f"{command[0]} took more than {timeout_s:.0f} s and was killed\n{_tail(err)}")
        if process.returncode != 0:
            raise BenchmarkFailed(f"{command[0]} exited with {process.returncode}\n{_tail(err)}\n{_tail(out)}")
        return out
    finally:
        if process.poll() is None:
            _kill_tree([process.pid])
            process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # anything of the session that is left


def run_mpi(cases: Sequence[Tuple[str, int]] = OPS, world_size: int = 2, pin: bool = True,
            iters_for: Optional[Callable[[str, int], int]] = None, timeout_s: float = TIMEOUT_S,
            smoke: bool = False) -> Optional[Dict[str, Dict[str, Any]]]:
    """Every case with Open MPI: ``comm.Allreduce`` (SUM), ``Bcast`` (root 0),
    ``Allgather`` and ``Barrier`` on float32 numpy arrays, through mpi4py, in
    one ``mpirun`` of `world_size` ranks (``shmrdv.bench._mpi_worker``).
    `iters_for(op, nbytes)` sets the timed calls of a case (default: about
    BUDGET_S of them). None, after a printed skip line, without mpirun or mpi4py."""
    why = _mpi_missing()
    if why:
        print(f"skipped Open MPI: {why}", flush=True)
        return None
    plan = _plan(cases, world_size, iters_for, smoke, MPI_COST)
    spec = json.dumps({"cases": plan, "lifetime_s": int(timeout_s) + 5})
    return launch_mpi(lambda scratch: mpirun_command(world_size, pin, scratch) +  # type: ignore[no-any-return]
                      [sys.executable, "-m", "shmrdv.bench._mpi_worker", spec], timeout_s, _MARK)


def mpi_rank_main(argv: List[str], mark: str, body: Callable[[Any, Any, Dict[str, Any]], Any]) -> int:
    """A rank's life under ``launch_mpi``: its JSON spec from argv[1], a hard
    lifetime (``lifetime_s``, SIGALRM), then ``body(MPI, comm, spec)``; rank 0
    prints what it returned under `mark`, one line of JSON. A rank that fails
    calls ``MPI_Abort``: otherwise the others would wait in their next call
    until the launcher's timeout."""
    spec = json.loads(argv[1])
    signal.alarm(int(spec["lifetime_s"]))  # outlives neither a stuck launcher nor a stuck peer
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        results = body(MPI, comm, spec)
        if comm.Get_rank() == 0:
            print(json.dumps({mark: results}), flush=True)
    except BaseException:
        print(f"rank {comm.Get_rank()}: {traceback.format_exc()}", file=sys.stderr, flush=True)
        comm.Abort(1)
    return 0


def launch_mpi(command_for: Callable[[str], List[str]], timeout_s: float, mark: str) -> Any:
    """Run the mpirun command line `command_for(scratch)` builds (scratch: a
    directory for Open MPI's segments and session files, removed afterwards),
    this package importable by its ranks, bounded by timeout_s; what rank 0
    printed under `mark`, in its last line of JSON that has it."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, **SINGLE_THREADED_MATH)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    _sweep_stale_scratch(shm)
    scratch = tempfile.mkdtemp(prefix=f"shmrdv-mpi-{os.getpid()}-", dir=shm)
    try:
        out = _run_bounded(command_for(scratch), timeout_s, env)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for line in reversed(out.splitlines()):
        if line.startswith("{") and mark in line:
            return json.loads(line)[mark]
    raise BenchmarkFailed(f"the Open MPI ranks printed no results\n{_tail(out)}")


# ---------------------------------------------------------------------------
# torch.distributed, gloo
# ---------------------------------------------------------------------------


def _gloo_missing() -> Optional[str]:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return "this torch has no torch.distributed gloo backend"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _gloo_case(torch: Any, dist: Any, op: str, nbytes: int, rank: int,
               size: int) -> Tuple[Callable[[], Any], Callable[[], None]]:
    """(call, check) of one case: `check` makes a call on known data and verifies it."""
    count = nbytes // ITEM
    if op == "allreduce":
        data = torch.empty(count, dtype=torch.float32)

        def check() -> None:
            data.fill_(rank + 1)
            dist.all_reduce(data)
            expect(op, data[[0, -1]], size * (size + 1) / 2)
            data.zero_()  # in place: keep the sums from growing to inf

        return (lambda: dist.all_reduce(data)), check
    if op == "broadcast":
        data = torch.full((count,), 7.0 if rank == 0 else 0.0, dtype=torch.float32)

        def check() -> None:
            dist.broadcast(data, src=0)
            expect(op, data[[0, -1]], 7.0)

        return (lambda: dist.broadcast(data, src=0)), check
    if op == "allgather":
        part = count // size
        mine = torch.full((part,), float(rank + 1), dtype=torch.float32)
        out = torch.empty(part * size, dtype=torch.float32)
        # all_gather_into_tensor under its newer name, where there is one: the
        # old name is a wrapper that warns on every call, which would be timed too
        allgather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def check() -> None:
            allgather(out, mine)
            # each rank's part, first and last element, holds its rank + 1
            expect(op, out.reshape(size, part)[:, [0, -1]].numpy(), np.arange(1, size + 1).reshape(size, 1))

        return (lambda: allgather(out, mine)), check
    if op == "barrier":
        return dist.barrier, dist.barrier
    raise ValueError(f"unknown collective {op!r}")


def _gloo_rank(rank: int, size: int, port: int, cpu: Optional[int], plan: List[List[Any]],
               lifetime_s: int, results: Any) -> None:
    """One gloo rank (spawned)."""

    def measure() -> Dict[str, Any]:
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                                timeout=timedelta(seconds=lifetime_s))
        try:
            times = {}
            for name, op, nbytes, iters, warmup in plan:
                call, check = _gloo_case(torch, dist, op, nbytes, rank, size)
                check()
                times[name] = time_calls(call, iters, warmup, dist.barrier)
        finally:
            dist.destroy_process_group()
        return {"times": times}

    run_rank(results, f"rank {rank}", cpu, lifetime_s, measure)


def run_gloo(cases: Sequence[Tuple[str, int]] = OPS, world_size: int = 2, pin: bool = True,
             iters_for: Optional[Callable[[str, int], int]] = None, timeout_s: float = TIMEOUT_S,
             smoke: bool = False) -> Optional[Dict[str, Dict[str, Any]]]:
    """Every case with torch.distributed gloo over loopback TCP: ``all_reduce``
    (SUM), ``broadcast`` (src 0), ``all_gather_into_tensor`` (``all_gather_single``
    in the torch versions that renamed it) and ``barrier``
    on float32 tensors, in `world_size` spawned processes, pinned one per CPU
    when `pin` and there are enough CPUs. Same cases, timing and return value
    as ``run_mpi``; None, after a printed skip line, without torch or gloo."""
    why = _gloo_missing()
    if why:
        print(f"skipped gloo: {why}", flush=True)
        return None
    plan = _plan(cases, world_size, iters_for, smoke, GLOO_COST)
    port = _free_port()
    with environment(dict(SINGLE_THREADED_MATH, GLOO_SOCKET_IFNAME="lo")):
        answers = run_spawned_ranks("gloo", _gloo_rank, world_size, pin, timeout_s,
                                    lambda rank, cpu, lifetime_s: (rank, world_size, port, cpu, plan, lifetime_s))
    return {name: summarize([answers[rank]["times"][name] for rank in range(world_size)], nbytes)
            for name, _op, nbytes, _iters, _warmup in plan}


def run_spawned_ranks(label: str, target: Callable[..., None], world_size: int, pin: bool, timeout_s: float,
                      args_for: Callable[[int, Optional[int], int], Tuple[Any, ...]]) -> Dict[int, Dict[str, Any]]:
    """Run `target(*args_for(rank, cpu, lifetime_s), writer)` in `world_size`
    spawned processes (pinned one per CPU when `pin` and there are enough
    CPUs) and return each rank's one answer, a dict sent through `writer`
    (``{"error": text}`` fails the run). Every rank is killed, with its
    descendants, after `timeout_s` or a failure: a rank waiting in a
    collective for one that failed would otherwise wait for its own timeout."""
    cpus = _cpus()
    pinned = pin and world_size <= len(cpus)
    lifetime_s = int(timeout_s) + 5
    context = multiprocessing.get_context("spawn")
    processes, readers = [], []
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(target=target, name=f"{label}-rank-{rank}", daemon=True,
                                      args=(*args_for(rank, cpus[rank] if pinned else None, lifetime_s), writer))
            process.start()
            writer.close()
            processes.append(process)
            readers.append(reader)
        answers: Dict[int, Dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while len(answers) < world_size:
            waiting = [reader for rank, reader in enumerate(readers) if rank not in answers]
            ready = wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise BenchmarkFailed(f"the {label} ranks took more than {timeout_s:.0f} s and were killed")
            for reader in ready:
                rank = readers.index(reader)
                try:
                    answers[rank] = reader.recv()
                except EOFError:
                    processes[rank].join(timeout=2)
                    code = processes[rank].exitcode
                    raise BenchmarkFailed(f"{label} rank {rank} ended without results (exit code {code})") from None
                if "error" in answers[rank]:
                    raise BenchmarkFailed(answers[rank]["error"])
        for process in processes:  # done: they are only closing their groups
            process.join(timeout=10)
        return answers
    finally:
        left = [process.pid for process in processes if process.is_alive()]
        if left:
            _kill_tree(left)
        for process in processes:
            process.join(timeout=5)
        for reader in readers:
            reader.close()
