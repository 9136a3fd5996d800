"""``shmrdv bench``: shmrdv side by side with what users pick instead.

This module is also the library behind ``benchmarks/`` (pytest-benchmark): the
transports, the child processes that drive them and the measurement loops live
here once, so the command line and the test suite measure the same thing.

Every transport moves the same float32 arrays between two spawned processes
and the consumer verifies what it got (the message number stamped into the
first and last element). A producer cycles through ``POOL`` source arrays, so
transports that keep a reference to what they were given (Queue, pyzmq with
``copy=False``, torch) never see an array rewritten before they are done with
it: each of them lets at most ``DEPTH`` messages be in flight.

Children are spawned, pinned, bounded (``SIGALRM`` after their lifetime, a
timeout on every wait, killed on failure) and every shared-memory segment a
benchmark creates is named ``/dev/shm/shmrdv-bench-<pid>-*`` and unlinked,
even after a crash of a child (``sweep_segments``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

KiB = 1024
MiB = 1024 * KiB
SIZES = [64, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
ROUND_TRIP_SIZES = [64, 4 * KiB]

# How long a benchmark waits for one message (or for space) before calling its peer dead.
MESSAGE_TIMEOUT_S = 30.0
# Spawning a child imports numpy (and torch for its transport): allow for a slow, busy machine.
STARTUP_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 30.0
CLEANUP_GRACE_S = 5.0
# A child that outlives this is killed by its own SIGALRM, even when the parent is stuck.
CHILD_LIFETIME_S = 900

# Messages a transport may have in flight (Queue maxsize, zmq high-water marks,
# slots of the hand-rolled ring in each direction).
DEPTH = 8
# Source arrays a producer cycles through: more than DEPTH can hold, so none is
# rewritten while a transport may still read it.
POOL = DEPTH + 3
# Stamps are float32: exact integers up to 2**24.
_STAMP_MODULO = 1 << 24

DATA_DTYPE = np.float32


def arena_bytes(nbytes: int) -> int:
    """Arena of the shmrdv rendezvous used for messages of `nbytes` (default size, or 4 messages)."""
    return max(64 * MiB, 4 * nbytes)


def human_size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes //= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    units = {"b": 1, "kib": KiB, "k": KiB, "mib": MiB, "m": MiB, "gib": 1024 * MiB, "g": 1024 * MiB}
    text = text.strip().lower().replace(" ", "")
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * units[unit]
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64B, 4KiB, 16MiB)")


# ---------------------------------------------------------------------------
# CPUs, environment and child processes
# ---------------------------------------------------------------------------


def allowed_cpus() -> List[int]:
    """CPUs this process may run on, lowest first."""
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run the calling thread on `cpu` only; restore its affinity on exit."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


@dataclass(frozen=True)
class Placement:
    """Where the measuring parent and its peer child run.

    "apart": parent and child on two different CPUs; "same": both on one CPU.
    Every transport of a comparison is measured with the same placement,
    since placement alone changes a round trip by 3x on 2-vCPU VMs.
    """

    name: str
    parent_cpu: int
    child_cpu: int


def placement(name: str) -> Placement:
    """"apart": first and second allowed CPU; "same": the first for both. ValueError on one CPU for "apart"."""
    cpus = allowed_cpus()
    if name == "apart":
        if len(cpus) < 2:
            raise ValueError("placement 'apart' needs 2 CPUs")
        return Placement("apart", cpus[0], cpus[1])
    if name == "same":
        return Placement("same", cpus[0], cpus[0])
    raise ValueError(f"unknown placement {name!r}")


# Without these, numpy's OpenBLAS starts a worker thread in every child that
# busy-waits (sched_yield) for a while after import; os.sched_setaffinity pins
# only the main thread, so that thread would spin on the parent's CPU.
_SINGLE_THREADED_MATH = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def _environment(variables: Dict[str, str]) -> Iterator[None]:
    """Set environment variables (inherited by children started meanwhile), then restore them."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _child_main(cpu: int, lifetime_s: int, target: Callable[..., None], args: Sequence[Any]) -> None:
    """Entry point of every child: hard lifetime limit, CPU pinning, then `target`."""
    # The default SIGALRM action ends the process: a bounded life at no cost inside the measured loops.
    signal.alarm(lifetime_s)
    os.sched_setaffinity(0, {cpu})
    target(*args)


class Children:
    """Spawned child processes; each is joined with a timeout.

    `join` checks that a child ended by itself and succeeded; `cleanup` kills
    whatever is still alive, so no child outlives its benchmark even when the
    benchmark failed half-way.
    """

    def __init__(self, lifetime_s: int = CHILD_LIFETIME_S) -> None:
        self.context = multiprocessing.get_context("spawn")
        self._lifetime_s = lifetime_s
        self._processes: List[BaseProcess] = []

    def pipe(self) -> Tuple[Connection, Connection]:
        """A duplex pipe; close the child's end in the parent after `start`."""
        return self.context.Pipe(duplex=True)

    def start(self, target: Callable[..., None], *args: Any, cpu: int) -> BaseProcess:
        """Start `target(*args)` in a spawned child pinned to `cpu` (a module-level function)."""
        process = self.context.Process(target=_child_main, args=(cpu, self._lifetime_s, target, args), daemon=True)
        with _environment(_SINGLE_THREADED_MATH):
            process.start()
        self._processes.append(process)
        return process

    def join(self, process: BaseProcess, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Wait for `process` to end by itself; fail if it hangs or failed."""
        process.join(timeout)
        if process.is_alive():
            _kill(process)
            raise AssertionError(f"child {process.pid} still running after {timeout} s: killed")
        if process.exitcode != 0:
            raise AssertionError(f"child {process.pid} failed with exit code {process.exitcode}")

    def cleanup(self) -> None:
        for process in self._processes:
            process.join(CLEANUP_GRACE_S)
            if process.is_alive():
                _kill(process)
            if process.exitcode is not None:
                process.close()
        self._processes.clear()


def _kill(process: BaseProcess) -> None:
    process.terminate()
    process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)


def wait_until_ready(child: BaseProcess, receive: Callable[[float], Any]) -> Any:
    """Return `receive(timeout)` once it succeeds; fail at once if `child` dies first.

    `receive` must raise TimeoutError (``shmrdv.RendezvousTimeout`` is one)
    when its timeout passes; it is retried in short slices for at most
    STARTUP_TIMEOUT_S.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            return receive(0.2)
        except TimeoutError:
            if not child.is_alive():
                raise AssertionError(f"child {child.pid} exited with code {child.exitcode} before it was ready") from None
            if time.monotonic() > deadline:
                raise


def _reply(control: Connection, child: BaseProcess, timeout: float = STARTUP_TIMEOUT_S) -> Any:
    """The child's next control message; fail early if it died."""
    deadline = time.monotonic() + timeout
    while not control.poll(0.2):
        if not child.is_alive():
            raise AssertionError(f"child {child.pid} exited with code {child.exitcode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"child {child.pid} did not answer within {timeout} s")
    return control.recv()


# ---------------------------------------------------------------------------
# Shared-memory names
# ---------------------------------------------------------------------------


def segment_prefix() -> str:
    """Prefix of every rendezvous name this process creates: ``bench-<pid>-``."""
    return f"bench-{os.getpid()}-"


def unique_name(kind: str = "") -> str:
    return f"{segment_prefix()}{kind}{uuid.uuid4().hex[:12]}"


def sweep_segments() -> List[str]:
    """Unlink every segment this process's benchmarks left in /dev/shm; returns their paths."""
    leftovers = glob.glob(f"/dev/shm/shmrdv-{segment_prefix()}*")
    for path in leftovers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return leftovers


def _ring_segment(name: str, create: bool, size: int = 0) -> Any:
    """A ``multiprocessing.shared_memory.SharedMemory`` for the hand-rolled ring.

    The creator unlinks it itself, explicitly. (Spawned children share their
    parent's resource tracker, where attaching only repeats the creator's
    registration, and ``unlink()`` withdraws it.)
    """
    from multiprocessing import shared_memory

    return shared_memory.SharedMemory(name, create=create, size=size)


# ---------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------


def stamp(array: np.ndarray, number: int) -> None:
    array[0] = array[-1] = number % _STAMP_MODULO


def check(array: np.ndarray, number: int, nbytes: int) -> None:
    """The consumer's verification: right size, message number in the first and last element."""
    expected = number % _STAMP_MODULO
    if array.nbytes != nbytes or array[0] != expected or array[-1] != expected:
        raise AssertionError(
            f"message {number}: got {array.nbytes} bytes starting with {array[0]}, ending with {array[-1]}"
        )


class Pool:
    """The producer's source arrays for one size, built as they are first needed."""

    def __init__(self) -> None:
        self.nbytes = -1
        self.arrays: List[np.ndarray] = []

    def build(self, nbytes: int) -> None:
        """Build every array for `nbytes` now (outside any timing)."""
        self.get(nbytes, POOL - 1)

    def get(self, nbytes: int, index: int) -> np.ndarray:
        if nbytes != self.nbytes:
            self.nbytes, self.arrays = nbytes, []
        slot = index % POOL
        while len(self.arrays) <= slot:
            self.arrays.append(np.full(nbytes // 4, len(self.arrays), dtype=DATA_DTYPE))
        return self.arrays[slot]


# ---------------------------------------------------------------------------
# Transports: one Endpoint class each, used on both sides of the pair
# ---------------------------------------------------------------------------


class Endpoint:
    """One end of a transport. Side 0 is the measuring parent, side 1 the child.

    ``channel`` holds what this side was given when the child was spawned.
    Per message size the parent calls ``prepare`` (per-size resources, e.g. a
    segment) and both sides ``enter`` with what it returned.
    """

    def __init__(self, side: int, channel: Any) -> None:
        self.side = side
        self.nbytes = 0

    def prepare(self, nbytes: int, **options: Any) -> Any:
        """Parent only: create what messages of `nbytes` need; return a picklable spec for `enter`."""
        return None

    def enter(self, nbytes: int, spec: Any) -> None:
        self.nbytes = nbytes

    def send_one(self, array: np.ndarray) -> None:
        raise NotImplementedError

    def receive_one(self, keep: bool = False) -> np.ndarray:
        """The next message as a float32 array; with `keep` it stays valid after later receives."""
        raise NotImplementedError

    def produce(self, count: int, first: int, pool: Pool) -> None:
        nbytes = self.nbytes
        for number in range(first, first + count):
            source = pool.get(nbytes, number)
            stamp(source, number)
            self.send_one(source)

    def echo(self, count: int) -> None:
        for _ in range(count):
            message = self.receive_one()
            self.send_one(message)
            del message

    def close(self) -> None:
        pass


class PipeEndpoint(Endpoint):
    """``multiprocessing.Pipe``: ``send_bytes`` of the array, ``recv_bytes_into`` a preallocated buffer."""

    def __init__(self, side: int, channel: Connection) -> None:
        super().__init__(side, channel)
        self.connection = channel
        self.buffer = np.empty(0, dtype=DATA_DTYPE)

    def enter(self, nbytes: int, spec: Any) -> None:
        super().enter(nbytes, spec)
        self.buffer = np.empty(nbytes // 4, dtype=DATA_DTYPE)

    def send_one(self, array: np.ndarray) -> None:
        self.connection.send_bytes(array)

    def receive_one(self, keep: bool = False) -> np.ndarray:
        if keep:
            return np.frombuffer(self.connection.recv_bytes(), dtype=DATA_DTYPE)
        self.connection.recv_bytes_into(self.buffer)
        return self.buffer

    def close(self) -> None:
        self.connection.close()


class QueueEndpoint(Endpoint):
    """``multiprocessing.Queue`` (maxsize DEPTH), one per direction: pickles each array."""

    def __init__(self, side: int, channel: Tuple[Any, Any]) -> None:
        super().__init__(side, channel)
        down, up = channel
        self.outbox, self.inbox = (down, up) if side == 0 else (up, down)

    def send_one(self, array: Any) -> None:
        self.outbox.put(array, timeout=MESSAGE_TIMEOUT_S)

    def receive_one(self, keep: bool = False) -> np.ndarray:
        return self.inbox.get(timeout=MESSAGE_TIMEOUT_S)

    def close(self) -> None:
        # The feeder thread has flushed everything the peer consumed; do not
        # wait for data nobody will read.
        self.outbox.cancel_join_thread()
        self.outbox.close()


class TorchQueueEndpoint(QueueEndpoint):
    """``torch.multiprocessing.Queue`` with CPU tensors: each put moves the tensor to a new shared segment."""

    def __init__(self, side: int, channel: Tuple[Any, Any]) -> None:
        super().__init__(side, channel)
        import torch

        self.torch = torch

    def send_one(self, array: Any) -> None:
        tensor = array if isinstance(array, self.torch.Tensor) else self.torch.from_numpy(array)
        self.outbox.put(tensor, timeout=MESSAGE_TIMEOUT_S)

    def receive_one(self, keep: bool = False) -> np.ndarray:
        return self.inbox.get(timeout=MESSAGE_TIMEOUT_S).numpy()


class ZmqEndpoint(Endpoint):
    """pyzmq PAIR socket over ``ipc://`` with ``copy=False`` both ways."""

    def __init__(self, side: int, channel: str) -> None:
        super().__init__(side, channel)
        import zmq

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PAIR)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, DEPTH)
        self.socket.setsockopt(zmq.RCVHWM, DEPTH)
        self.socket.setsockopt(zmq.RCVTIMEO, int(MESSAGE_TIMEOUT_S * 1000))
        self.socket.setsockopt(zmq.SNDTIMEO, int(MESSAGE_TIMEOUT_S * 1000))
        if side == 0:
            self.socket.bind(channel)
        else:
            self.socket.connect(channel)

    def send_one(self, array: Any) -> None:
        self.socket.send(array, copy=False)

    def receive_one(self, keep: bool = False) -> np.ndarray:
        frame = self.socket.recv(copy=False)
        return np.frombuffer(frame.buffer, dtype=DATA_DTYPE)

    def close(self) -> None:
        self.socket.close(0)
        self.context.term()


class RingEndpoint(Endpoint):
    """A hand-rolled ``multiprocessing.shared_memory`` ring: DEPTH slots per direction,
    only slot numbers cross the Pipe (a data slot ``n >= 0``, or a freed slot ``-1 - n``)."""

    def __init__(self, side: int, channel: Connection) -> None:
        super().__init__(side, channel)
        self.connection = channel
        self.segment: Any = None
        self.owner = side == 0
        self.slots = np.empty((0, 0), dtype=DATA_DTYPE)
        # Our slots (ours are side*DEPTH .. side*DEPTH+DEPTH-1) that the other side
        # has given back. Slot numbers do not depend on the size, so this
        # accounting carries over from one segment to the next.
        self.free = deque(range(side * DEPTH, (side + 1) * DEPTH))
        self.held: Optional[int] = None  # the slot of the last message received, freed at the next receive

    def prepare(self, nbytes: int, **options: Any) -> Any:
        self._drop_segment()
        self.segment = _ring_segment(f"shmrdv-{unique_name('ring-')}", create=True, size=2 * DEPTH * nbytes)
        return self.segment.name

    def enter(self, nbytes: int, spec: Any) -> None:
        super().enter(nbytes, spec)
        self._give_back()
        if not self.owner:
            self._drop_segment()
            self.segment = _ring_segment(spec, create=False)
        self.slots = np.ndarray((2 * DEPTH, nbytes // 4), dtype=DATA_DTYPE, buffer=self.segment.buf)

    def _give_back(self) -> None:
        if self.held is not None:
            self.connection.send_bytes((-1 - self.held).to_bytes(4, "little", signed=True))
            self.held = None

    def send_one(self, array: np.ndarray) -> None:
        while not self.free:
            number = int.from_bytes(self.connection.recv_bytes(), "little", signed=True)
            if number >= 0:
                raise AssertionError("ring: a message arrived while the sender waited for a free slot")
            self.free.append(-1 - number)
        slot = self.free.popleft()
        np.copyto(self.slots[slot], array)
        self.connection.send_bytes(slot.to_bytes(4, "little", signed=True))

    def receive_one(self, keep: bool = False) -> np.ndarray:
        self._give_back()
        while True:
            number = int.from_bytes(self.connection.recv_bytes(), "little", signed=True)
            if number >= 0:
                break
            self.free.append(-1 - number)
        if keep:  # the slot is reused after DEPTH messages: a kept message needs its own copy
            self.connection.send_bytes((-1 - number).to_bytes(4, "little", signed=True))
            return self.slots[number].copy()
        self.held = number
        return self.slots[number]

    def _drop_segment(self) -> None:
        if self.segment is None:
            return
        self.slots = np.empty((0, 0), dtype=DATA_DTYPE)  # no export of the buffer may outlive close()
        self.segment.close()
        if self.owner:
            self.segment.unlink()
        self.segment = None

    def close(self) -> None:
        self._drop_segment()
        self.connection.close()


class ShmrdvEndpoint(Endpoint):
    """shmrdv ``send``/``recv``: one rendezvous per message size, created by the parent."""

    def __init__(self, side: int, channel: Any) -> None:
        super().__init__(side, channel)
        import shmrdv

        self.shmrdv = shmrdv
        self.rdv: Any = None
        self.owner = side == 0
        self.outbox, self.inbox = ("down", "up") if side == 0 else ("up", "down")

    def prepare(self, nbytes: int, pending_keys: int = 0, size: int = 0, **options: Any) -> Any:
        self._drop()
        arena = size or arena_bytes(nbytes)
        max_keys = max(1024, 2 * pending_keys + 1024)
        self.rdv = self.shmrdv.Rendezvous(unique_name(), create=True, size=arena, max_keys=max_keys)
        fill_pending_keys(self.rdv, pending_keys)
        return self.rdv.name

    def enter(self, nbytes: int, spec: Any) -> None:
        super().enter(nbytes, spec)
        if not self.owner:
            self._drop()
            self.rdv = self.shmrdv.Rendezvous(spec, create=False)

    def send_one(self, array: np.ndarray) -> None:
        self.rdv.send(self.outbox, array, timeout=MESSAGE_TIMEOUT_S)

    def receive_one(self, keep: bool = False) -> np.ndarray:
        return self.rdv.recv(self.inbox, timeout=MESSAGE_TIMEOUT_S)

    def _drop(self) -> None:
        if self.rdv is None:
            return
        self.rdv.close()
        if self.owner:
            self.rdv.unlink()
        self.rdv = None

    def close(self) -> None:
        self._drop()


class ShmrdvAllocEndpoint(ShmrdvEndpoint):
    """shmrdv ``alloc``/``recv``: the producer writes its message (here: the two stamps) in place."""

    def produce(self, count: int, first: int, pool: Pool) -> None:
        rdv, key, shape = self.rdv, self.outbox, (self.nbytes // 4,)
        for number in range(first, first + count):
            with rdv.alloc(key, shape, DATA_DTYPE, timeout=MESSAGE_TIMEOUT_S) as buffer:
                stamp(buffer, number)


def fill_pending_keys(rdv: Any, count: int) -> None:
    """Queue one 64 B message under each of `count` distinct keys, never received."""
    message = np.zeros(16, dtype=DATA_DTYPE)
    for index in range(count):
        rdv.send(f"pending/{index}", message, timeout=MESSAGE_TIMEOUT_S)


# Channels: what each side of a transport is given at spawn (side 0, side 1),
# and what the parent removes afterwards.


def _pipe_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    ours, theirs = context.Pipe(duplex=True)
    return ours, theirs, lambda: None


def _queue_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    down, up = context.Queue(DEPTH), context.Queue(DEPTH)
    return (down, up), (down, up), lambda: None


def _torch_queue_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    import torch.multiprocessing as torch_mp

    torch_context = torch_mp.get_context("spawn")
    down, up = torch_context.Queue(DEPTH), torch_context.Queue(DEPTH)
    return (down, up), (down, up), lambda: None


def _zmq_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    directory = tempfile.mkdtemp(prefix="shmrdv-bench-zmq-")
    address = f"ipc://{directory}/pair"
    return address, address, lambda: shutil.rmtree(directory, ignore_errors=True)


def _no_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    return None, None, lambda: None


@dataclass(frozen=True)
class Transport:
    name: str  # command line and JSON
    label: str  # tables and plot
    endpoint: Optional[type]  # None: measured in one process
    channel: Callable[[Any], Tuple[Any, Any, Callable[[], None]]]
    kind: str  # "shmrdv", "peer" or "limit"
    requires: Tuple[str, ...] = ()
    round_trip: bool = True

    def missing(self) -> Optional[str]:
        """Why this transport cannot run here, or None."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                extra = {"zmq": "pip install pyzmq", "torch": "pip install torch"}.get(module, f"pip install {module}")
                return f"{module} is not installed ({extra})"
        return None


TRANSPORTS: Dict[str, Transport] = {
    t.name: t
    for t in [
        Transport("shmrdv", "shmrdv send/recv", ShmrdvEndpoint, _no_channel, "shmrdv"),
        Transport("shmrdv-alloc", "shmrdv alloc/recv", ShmrdvAllocEndpoint, _no_channel, "shmrdv", round_trip=False),
        Transport("copyto", "np.copyto (1 process)", None, _no_channel, "limit", round_trip=False),
        Transport("queue", "mp.Queue", QueueEndpoint, _queue_channel, "peer"),
        Transport("pipe", "mp.Pipe", PipeEndpoint, _pipe_channel, "peer"),
        Transport("shm-ring", "shared_memory ring", RingEndpoint, _pipe_channel, "peer"),
        Transport("zmq", "pyzmq ipc", ZmqEndpoint, _zmq_channel, "peer", requires=("zmq",)),
        Transport("torch", "torch.mp.Queue", TorchQueueEndpoint, _torch_queue_channel, "peer", requires=("torch",)),
    ]
}
PEERS = [name for name, t in TRANSPORTS.items() if t.kind == "peer"]


def _serve(transport_name: str, channel: Any, control: Connection) -> None:
    """A child's life: build its endpoint, then follow the parent's commands until "stop"."""
    endpoint = TRANSPORTS[transport_name].endpoint(1, channel)  # type: ignore[misc]
    pool = Pool()
    control.send("ready")
    try:
        while True:
            try:
                command, *params = control.recv()
            except EOFError:
                return
            if command == "stop":
                return
            if command == "pin":
                os.sched_setaffinity(0, {params[0]})
                control.send("ok")
            elif command == "enter":
                nbytes, spec, prebuild = params
                endpoint.enter(nbytes, spec)
                if prebuild:
                    pool.build(nbytes)
                control.send("ok")
            elif command == "produce":
                endpoint.produce(params[0], params[1], pool)
            elif command == "echo":
                endpoint.echo(params[0])
            else:
                raise ValueError(f"unknown command {command!r}")
    finally:
        endpoint.close()


class Peer:
    """The parent's side of a transport: its endpoint and the child at the other end.

    ``resize(nbytes)`` before measuring a size; ``stream(count)`` times count
    messages from the child, verified; ``round_trips(count)`` times each of
    count echoes. Use as a context manager (``close`` stops the child and
    removes every resource).
    """

    def __init__(self, transport: Transport, child_cpu: int, lifetime_s: int = CHILD_LIFETIME_S) -> None:
        self.transport = transport
        self.nbytes = 0
        self._next_number = 0
        self._children = Children(lifetime_s)
        ours, theirs, self._remove_channel = transport.channel(self._children.context)
        self._control, child_control = self._children.pipe()
        try:
            self._child = self._children.start(_serve, transport.name, theirs, child_control, cpu=child_cpu)
            child_control.close()
            if isinstance(theirs, Connection):
                theirs.close()  # only the child holds its end now: its death is an EOF for us
            self.endpoint: Endpoint = transport.endpoint(0, ours)  # type: ignore[misc]
            if _reply(self._control, self._child) != "ready":
                raise AssertionError("child did not start")
        except BaseException:
            self._children.cleanup()
            self._remove_channel()
            raise

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _command(self, *command: Any) -> None:
        try:
            self._control.send(command)
        except (BrokenPipeError, ConnectionResetError):
            raise AssertionError(f"child {self._child.pid} exited with code {self._child.exitcode}") from None

    def _acknowledged(self, *command: Any) -> None:
        self._command(*command)
        if _reply(self._control, self._child) != "ok":
            raise AssertionError(f"child did not acknowledge {command[0]!r}")

    def pin_child(self, cpu: int) -> None:
        self._acknowledged("pin", cpu)

    def resize(self, nbytes: int, prebuild: bool = False, **options: Any) -> None:
        """Messages of `nbytes` from now on. `prebuild`: the producer builds all its
        source arrays now rather than as first needed. Options: shmrdv ``pending_keys=``, ``size=``."""
        spec = self.endpoint.prepare(nbytes, **options)
        self.endpoint.enter(nbytes, spec)
        self._acknowledged("enter", nbytes, spec, prebuild)
        self.nbytes = nbytes

    def stream(self, count: int) -> float:
        """Seconds for the child to produce, and us to receive and verify, `count` messages."""
        first, nbytes, receive = self._next_number, self.nbytes, self.endpoint.receive_one
        self._next_number += count
        start = time.perf_counter()
        self._command("produce", count, first)
        for number in range(first, first + count):
            message = receive()
            check(message, number, nbytes)
            del message
        return time.perf_counter() - start

    def hold(self, count: int) -> List[np.ndarray]:
        """Receive and verify `count` messages, keeping all of them."""
        first = self._next_number
        self._next_number += count
        self._command("produce", count, first)
        kept = []
        for number in range(first, first + count):
            kept.append(self.endpoint.receive_one(keep=True))
            check(kept[-1], number, self.nbytes)
        return kept

    def start_echo(self, count: int) -> None:
        """The child echoes the next `count` messages; then ``ping`` each of them."""
        self._command("echo", count)

    def ping(self, payload: np.ndarray) -> np.ndarray:
        self.endpoint.send_one(payload)
        return self.endpoint.receive_one()

    def round_trips(self, count: int) -> List[float]:
        """Seconds of each of `count` round trips of a message of the current size, verified."""
        payload = np.zeros(self.nbytes // 4, dtype=DATA_DTYPE)
        times = []
        self.start_echo(count)
        send, receive, clock = self.endpoint.send_one, self.endpoint.receive_one, time.perf_counter_ns
        for number in range(self._next_number, self._next_number + count):
            stamp(payload, number)
            start = clock()
            send(payload)
            echo = receive()
            times.append(clock() - start)
            check(echo, number, self.nbytes)
            del echo
        self._next_number += count
        return [t / 1e9 for t in times]

    def close(self) -> None:
        try:
            if self._child.is_alive():
                with contextlib.suppress(OSError):
                    self._control.send(("stop",))
                self._children.join(self._child)
        finally:
            self._children.cleanup()
            self.endpoint.close()
            self._control.close()
            self._remove_channel()


class LocalCopy:
    """The physical limit: ``np.copyto`` of the same bytes in one process.

    Destinations span the same memory as the shmrdv arena and are used in turn
    like its ring (a single destination could stay in the L3 cache, a limit no
    arena of realistic size reaches); sources cycle through POOL arrays like
    every producer's. Same interface as ``Peer`` for ``resize``/``stream``.
    """

    def __init__(self) -> None:
        self.nbytes = 0
        self._pool = Pool()
        self._destinations: List[np.ndarray] = []
        self._next_number = 0

    def __enter__(self) -> "LocalCopy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resize(self, nbytes: int, prebuild: bool = False, **options: Any) -> None:
        self.nbytes = nbytes
        if prebuild:
            self._pool.build(nbytes)
        count = max(2, arena_bytes(nbytes) // nbytes)
        self._destinations = [np.zeros(nbytes // 4, dtype=DATA_DTYPE) for _ in range(count)]  # touched now

    def stream(self, count: int) -> float:
        first, nbytes, pool, destinations = self._next_number, self.nbytes, self._pool, self._destinations
        self._next_number += count
        for number in range(first, first + min(count, POOL)):  # build the pool outside the timing
            pool.get(nbytes, number)
        turns = len(destinations)
        start = time.perf_counter()
        for number in range(first, first + count):
            source = pool.get(nbytes, number)
            stamp(source, number)
            destination = destinations[number % turns]
            np.copyto(destination, source)
            check(destination, number, nbytes)
        return time.perf_counter() - start

    def close(self) -> None:
        self._destinations = []


def open_peer(name: str, child_cpu: int, lifetime_s: int = CHILD_LIFETIME_S) -> Any:
    """A Peer (or LocalCopy for "copyto") for transport `name`."""
    transport = TRANSPORTS[name]
    if transport.endpoint is None:
        return LocalCopy()
    return Peer(transport, child_cpu, lifetime_s)


# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


def timed_stream(peer: Any, target_s: float, max_count: int = 10_000_000, min_count: int = 3) -> Tuple[int, float]:
    """(messages, seconds) of one timed stream lasting about `target_s`.

    Warm-up streams first: POOL messages (every source array and ring slot
    built and touched), then growing until one lasts a fifth of the target,
    then up to two passes over the shmrdv arena (every page touched by both
    processes). Then one timed stream sized from the warm-up rate.
    """
    count = min(POOL, max_count)
    warmed = 0
    while True:
        elapsed = peer.stream(count)
        warmed += count
        if elapsed >= target_s / 5 or count >= max_count:
            break
        count = min(max_count, count * 4)
    arena_passes = 2 * arena_bytes(peer.nbytes) // max(peer.nbytes, 1)
    if warmed < arena_passes and peer.nbytes >= 64 * KiB:
        peer.stream(min(arena_passes - warmed, max_count))
    count = int(min(max_count, max(min_count, count * target_s / max(elapsed, 1e-9))))
    return count, peer.stream(count)


def timed_round_trips(peer: Peer, target_s: float, max_count: int, warmup: int = 100) -> List[float]:
    """Round-trip times after `warmup` untimed ones; as many as fit `target_s` (at most `max_count`)."""
    warm = peer.round_trips(warmup)
    per_trip = statistics.median(warm)
    count = int(min(max_count, max(50, target_s / max(per_trip, 1e-9))))
    return peer.round_trips(count)


def throughput_row(transport: str, where: str, nbytes: int, messages: int, seconds: float) -> Dict[str, Any]:
    """One throughput figure, as JSON and the tables have it."""
    return {"transport": transport, "label": TRANSPORTS[transport].label, "placement": where, "bytes": nbytes,
            "messages": messages, "seconds": seconds, "gbps": messages * nbytes / seconds / 1e9,
            "msgs_per_s": messages / seconds}


def round_trip_row(transport: str, where: str, nbytes: int, times: Sequence[float]) -> Dict[str, Any]:
    """One round-trip figure (times in seconds), as JSON and the tables have it."""
    return {"transport": transport, "label": TRANSPORTS[transport].label, "placement": where, "bytes": nbytes,
            "round_trips": len(times), "median_us": statistics.median(times) * 1e6, "p99_us": p99(times) * 1e6}


def p99(data: Sequence[float]) -> float:
    """99th percentile (nearest rank)."""
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def rss_kib() -> Dict[str, int]:
    """This process's resident memory by kind (kB from /proc/self/status)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                fields[name] = int(value.split()[0])
    return fields


def _growth_worker(role: str, name: str, key: str, nbytes: int, count: int, control: Connection) -> None:
    """One producer or consumer of the process-count scaling run; reports (start, end) monotonic times."""
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        source = np.zeros(nbytes // 4, dtype=DATA_DTYPE)
        control.send("ready")
        if control.recv() != "go":
            return
        start = time.monotonic()
        for number in range(count):
            if role == "producer":
                stamp(source, number)
                rdv.send(key, source, timeout=MESSAGE_TIMEOUT_S)
            else:
                message = rdv.recv(key, timeout=MESSAGE_TIMEOUT_S)
                check(message, number, nbytes)
                del message
        control.send((start, time.monotonic()))


def process_scaling(pairs: int, nbytes: int, count: int, lifetime_s: int = CHILD_LIFETIME_S) -> Dict[str, float]:
    """Aggregate send/recv throughput of `pairs` producer/consumer process pairs, each on its own key
    of one rendezvous, spread round-robin over the allowed CPUs."""
    import shmrdv

    cpus = allowed_cpus()
    children = Children(lifetime_s)
    controls: List[Connection] = []
    try:
        with shmrdv.Rendezvous(unique_name(), create=True, size=arena_bytes(nbytes)) as rdv:
            try:
                processes = []
                for pair in range(pairs):
                    for offset, role in enumerate(("producer", "consumer")):
                        ours, theirs = children.pipe()
                        cpu = cpus[(pair + offset) % len(cpus)]
                        processes.append(children.start(_growth_worker, role, rdv.name, f"k{pair}", nbytes, count, theirs, cpu=cpu))
                        theirs.close()
                        controls.append(ours)
                for control, process in zip(controls, processes):
                    if _reply(control, process) != "ready":
                        raise AssertionError("growth worker did not start")
                for control in controls:
                    control.send("go")
                spans = [_reply(control, process, MESSAGE_TIMEOUT_S * 2) for control, process in zip(controls, processes)]
                for process in processes:
                    children.join(process)
            finally:
                rdv.unlink()
    finally:
        children.cleanup()
        for control in controls:
            control.close()
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    total = pairs * count
    return {"pairs": pairs, "processes": 2 * pairs, "bytes": nbytes, "messages": total, "seconds": elapsed,
            "gbps": total * nbytes / elapsed / 1e9, "msgs_per_s": total / elapsed}


def pending_keys_arena(pending_keys: int, nbytes: int, messages: int) -> int:
    """Arena for `pending_keys` unreceived 64 B messages plus `messages` more of `nbytes`.

    A message that stays queued pins the arena's ring: space behind it is not
    reused until it is received, so the arena must hold everything sent."""
    return pending_keys * 256 + messages * (nbytes + 256) + 4 * MiB


def keys_scaling(peer: Peer, pending_keys: int, nbytes: int, count: int, rounds: int) -> Dict[str, float]:
    """send/recv streaming throughput with `pending_keys` other keys holding an unreceived message
    (median of `rounds` streams of `count` messages, after one warm-up stream)."""
    arena = pending_keys_arena(pending_keys, nbytes, (rounds + 1) * count)
    peer.resize(nbytes, pending_keys=pending_keys, size=arena)
    peer.stream(count)  # warm-up
    best = [peer.stream(count) for _ in range(rounds)]
    elapsed = statistics.median(best)
    return {"pending_keys": pending_keys, "bytes": nbytes, "messages": count, "seconds": elapsed,
            "gbps": count * nbytes / elapsed / 1e9, "msgs_per_s": count / elapsed}


def held_views_memory(peer: Peer, nbytes: int, views: int) -> Dict[str, Any]:
    """Receiver memory growth while holding `views` received messages of `nbytes` (every byte read)."""
    peer.resize(nbytes, size=max(arena_bytes(nbytes), 2 * views * (nbytes + 4 * KiB)))
    peer.stream(2)  # warm-up: mapping, first messages
    before = rss_kib()
    kept = peer.hold(views)
    checksum = float(sum(float(np.sum(view, dtype=np.float64)) for view in kept))
    after = rss_kib()
    del kept
    growth = {name: after[name] - before[name] for name in before}
    return {"bytes": nbytes, "views": views, "held_bytes": views * nbytes, "checksum": checksum,
            "rss_anon_growth_kib": growth["RssAnon"], "rss_shmem_growth_kib": growth["RssShmem"],
            "rss_growth_kib": growth["VmRSS"]}


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


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "allowed_cpus": allowed_cpus(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    with contextlib.suppress(OSError):
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as l3:
            info["l3"] = l3.read().strip()
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as meminfo:
            info["memory_gib"] = round(int(meminfo.readline().split()[1]) / MiB, 1)
    import shmrdv

    info["shmrdv"] = shmrdv.__version__
    for module in ("zmq", "torch"):
        if importlib.util.find_spec(module) is not None:
            info[module] = importlib.import_module(module).__version__
    return info


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


def _measure_transport(name: str, plan: Plan, results: Results, progress: Progress, lifetime_s: int) -> None:
    transport = TRANSPORTS[name]
    placements = _placements()
    where = placements[0]
    with pinned(where.parent_cpu), open_peer(name, where.child_cpu, lifetime_s) as peer:
        for nbytes in plan.sizes:
            peer.resize(nbytes)
            count, seconds = timed_stream(peer, plan.stream_s, plan.max_stream_count)
            row = throughput_row(name, where.name, nbytes, count, seconds)
            results.throughput.append(row)
            progress.step(f"{transport.label:<22} {human_size(nbytes):>8} one-way: {row['gbps']:8.3f} GB/s "
                          f"{row['msgs_per_s']:>11,.0f} msg/s")
        if not transport.round_trip:
            return
        for where in placements:
            placement_name = where.name
            peer.pin_child(where.child_cpu)
            with pinned(where.parent_cpu):
                for nbytes in ROUND_TRIP_SIZES:
                    peer.resize(nbytes)
                    times = timed_round_trips(peer, plan.round_trip_s, plan.max_round_trips, plan.round_trip_warmup)
                    row = round_trip_row(name, placement_name, nbytes, times)
                    results.round_trip.append(row)
                    progress.step(f"{transport.label:<22} {human_size(nbytes):>8} round trip, {placement_name}: "
                                  f"median {row['median_us']:7.1f} us, p99 {row['p99_us']:7.1f} us")


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
        ours, best = results.rtt("shmrdv", placement_name, 64), _best_peer_rtt(results, placement_name, 64)
        if ours and best:
            add(f"64 B round trip, {placement_name}: best peer / shmrdv (median)", best["median_us"] / ours["median_us"],
                5.0 if placement_name == "apart" else 0.0,
                f"shmrdv {ours['median_us']:.1f} us (p99 {ours['p99_us']:.1f}) vs {best['label']} "
                f"{best['median_us']:.1f} us (p99 {best['p99_us']:.1f}); p99 ratio {best['p99_us'] / ours['p99_us']:.2f}x")
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
    lines = ["### One-way throughput, GB/s (messages/s up to 64 KiB), producer and consumer pinned apart", "",
             "| size | " + " | ".join(TRANSPORTS[n].label for n in names) + " |",
             "|---|" + "---:|" * len(names)]
    for nbytes in sizes:
        cells = []
        for n in names:
            row = next((r for r in results.throughput if r["transport"] == n and r["bytes"] == nbytes), None)
            cells.append(_gbps_cell(row and row["gbps"], row and row["msgs_per_s"], nbytes))
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
                ours, best = results.rtt("shmrdv", placement_name, nbytes), _best_peer_rtt(results, placement_name, nbytes)
                ratio = (f"{best['median_us'] / ours['median_us']:.2f}x, {best['p99_us'] / ours['p99_us']:.2f}x "
                         f"({best['label']})") if ours and best else "—"
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
        lines += ["", "### Targets", "", "| target | ratio | goal | met | figures |", "|---|---:|---:|---|---|"]
        for t in results.targets:
            met = "—" if not t["goal"] else ("yes" if t["met"] else "**no**")
            lines.append(f"| {t['target']} | {t['ratio']:.2f}x | {'≥ %gx' % t['goal'] if t['goal'] else 'report'} | {met} | {t['detail']} |")
    if results.skipped:
        lines += [""] + [f"Skipped {TRANSPORTS[n].label}: {why}." for n, why in results.skipped.items()]
    return "\n".join(lines)


def plot(results: Results, path: str) -> None:
    """Log-log throughput vs size, one line per transport."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"shmrdv": ("tab:red", "o", "-"), "shmrdv-alloc": ("tab:red", "s", "--"), "copyto": ("black", "", ":"),
              "queue": ("tab:blue", "v", "-"), "pipe": ("tab:purple", "^", "-"), "shm-ring": ("tab:green", "D", "-"),
              "zmq": ("tab:orange", "P", "-"), "torch": ("tab:gray", "X", "-")}
    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    for name in TRANSPORTS:
        rows = sorted((r for r in results.throughput if r["transport"] == name), key=lambda r: r["bytes"])
        if not rows:
            continue
        color, marker, line = styles.get(name, ("tab:olive", ".", "-"))
        axes.plot([r["bytes"] for r in rows], [r["gbps"] for r in rows], marker=marker, linestyle=line,
                  color=color, label=TRANSPORTS[name].label, linewidth=2 if name.startswith("shmrdv") else 1.3)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    sizes = sorted({r["bytes"] for r in results.throughput})
    axes.set_xticks(sizes, [human_size(s) for s in sizes])
    axes.set_xlabel("message size")
    axes.set_ylabel("one-way throughput, GB/s (log)")
    m = results.machine
    axes.set_title(f"float32 arrays between two processes, pinned apart\n{m.get('cpu')}, "
                   f"{m.get('cpus')} CPUs, Linux {m.get('kernel')}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--full", action="store_true",
                        help="every size up to 256 MiB, longer runs and every growth step (several minutes)")
    parser.add_argument("--smoke", action="store_true",
                        help="a few messages of each kind: checks that everything runs; the figures mean nothing")
    parser.add_argument("--transports", default=",".join(TRANSPORTS),
                        help="comma-separated subset of: " + ", ".join(TRANSPORTS))
    parser.add_argument("--sizes", type=lambda t: [parse_size(s) for s in t.split(",")],
                        help="comma-separated message sizes (e.g. 64B,4KiB,16MiB) instead of the mode's")
    parser.add_argument("--no-growth", action="store_true", help="skip the cost-growth measurements")
    parser.add_argument("--json", metavar="FILE", help="write the raw figures as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="write a log-log plot of throughput vs size (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--from-json", metavar="FILE",
                        help="measure nothing: print the tables (and --plot) of a run saved with --json")


def run(args: argparse.Namespace) -> int:
    if args.full and args.smoke:
        print("shmrdv bench: --full and --smoke exclude each other", file=sys.stderr)
        return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("shmrdv bench: --plot needs matplotlib: pip install 'shmrdv[bench]' (or pip install matplotlib)",
              file=sys.stderr)
        return 2
    if args.from_json:
        with open(args.from_json) as saved:
            results = Results(**json.load(saved))
        print(markdown(results))
        if args.plot:
            plot(results, args.plot)
        return 0
    plan = Plan.for_mode("full" if args.full else "smoke" if args.smoke else "quick")
    if args.sizes:
        plan.sizes = sorted(args.sizes)
    wanted = [n.strip() for n in args.transports.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in TRANSPORTS]
    if unknown:
        print(f"shmrdv bench: unknown transport(s) {', '.join(unknown)}; known: {', '.join(TRANSPORTS)}", file=sys.stderr)
        return 2
    results = Results(machine=machine(), command="shmrdv bench " + " ".join(sys.argv[2:] if len(sys.argv) > 1 else []),
                      mode=plan.mode)
    names = []
    for name in (n for n in TRANSPORTS if n in wanted):
        why = TRANSPORTS[name].missing()
        if why:
            results.skipped[name] = why
            print(f"skipping {TRANSPORTS[name].label}: {why}", file=sys.stderr)
        else:
            names.append(name)
    steps = sum(len(plan.sizes) + (4 * len(ROUND_TRIP_SIZES) if TRANSPORTS[n].round_trip else 0) for n in names)
    if not args.no_growth:
        steps += len(plan.pairs) + len(plan.pending_keys) + len(plan.rss_sizes)
    progress = Progress(steps, args.quiet)
    m = results.machine
    progress.say(f"shmrdv bench ({plan.mode}): {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}; "
                 f"{len(names)} transports, sizes {', '.join(human_size(s) for s in plan.sizes)}")
    lifetime = CHILD_LIFETIME_S * (3 if plan.mode == "full" else 1)
    # SIGTERM unwinds like Ctrl-C: children are stopped and every segment unlinked.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    start = time.monotonic()
    try:
        for name in names:
            _measure_transport(name, plan, results, progress, lifetime)
        if not args.no_growth and "shmrdv" in names:
            _measure_growth(plan, results, progress, lifetime)
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
