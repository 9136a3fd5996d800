"""The transports compared: one Endpoint class each, the payload checks, and Peer, which drives one child."""

from __future__ import annotations
import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
import numpy as np

from .common import _STAMP_MODULO, BATCH, BATCH_BYTES, BATCH_MAX, CHILD_LIFETIME_S, DATA_DTYPE, DEPTH, MESSAGE_TIMEOUT_S, POOL, arena_bytes, whole_pages
from . import mpi_p2p
from .processes import Children, _reply, _ring_segment, unique_name

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


def batch_for(nbytes: int) -> int:
    """Messages per call of a batched producer: BATCH, fewer for large messages."""
    return max(1, min(BATCH, BATCH_BYTES // max(nbytes, 1)))


class Pool:
    """The producer's source arrays for one size, built as they are first needed.
    A batched producer's pool has a distinct array for each message of a batch
    (the batch is read when it is sent, after all of it is stamped)."""

    def __init__(self, batched: bool = False) -> None:
        self.nbytes = -1
        self.slots = POOL
        self.batched = batched
        self.arrays: List[np.ndarray] = []

    def build(self, nbytes: int) -> None:
        """Build every array for `nbytes` now (outside any timing)."""
        self.get(nbytes, 0)
        self.get(nbytes, self.slots - 1)

    def get(self, nbytes: int, index: int) -> np.ndarray:
        if nbytes != self.nbytes:
            self.nbytes, self.arrays = nbytes, []
            self.slots = max(POOL, batch_for(nbytes)) if self.batched else POOL
        slot = index % self.slots
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

    # Whether the producer sends from the POOL source arrays (and builds them
    # up front when asked to): at 256 MiB they take 2.75 GiB.
    uses_pool = True
    # Whether the consumer takes messages in batches (receive_batch) when streaming.
    batched = False

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

    def receive_batch(self) -> List[np.ndarray]:
        """Batched transports: the next messages, at least one, as many as are there (up to BATCH_MAX)."""
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

    def round_trips(self, payload: np.ndarray, first: int, count: int) -> List[int]:
        """Nanoseconds of each of `count` round trips of `payload`, stamped with
        its number from `first`, each echo checked (``Peer.round_trips``)."""
        send, receive, clock, nbytes = self.send_one, self.receive_one, time.perf_counter_ns, self.nbytes
        times = []
        for number in range(first, first + count):
            stamp(payload, number)
            start = clock()
            send(payload)
            echo = receive()
            times.append(clock() - start)
            check(echo, number, nbytes)
            del echo
        return times

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
        self.connection.send_bytes(array)  # type: ignore[arg-type]  # ndarray is a buffer

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
    """shmrdv ``send``/``recv``: one rendezvous per message size, created by
    the parent: a private one (a memfd, as ``Rendezvous()`` makes, which
    no /dev/shm of any size limits), or with huge pages a named one in
    /dev/shm, whose mount gives them."""

    def __init__(self, side: int, channel: Any) -> None:
        super().__init__(side, channel)
        import shmrdv

        self.shmrdv = shmrdv
        self.rdv: Any = None
        self.owner = side == 0
        self.outbox, self.inbox = ("down", "up") if side == 0 else ("up", "down")

    def prepare(self, nbytes: int, pending_keys: int = 0, size: int = 0, huge_pages: bool = False,
                **options: Any) -> Any:
        self._drop()
        arena = whole_pages(size or arena_bytes(nbytes))
        max_keys = max(1024, 2 * pending_keys + 1024)
        if huge_pages:
            self.rdv = self.shmrdv.Rendezvous(unique_name(), create=True, size=arena, max_keys=max_keys,
                                              huge_pages=True)
        else:
            self.rdv = self.shmrdv.Rendezvous(size=arena, max_keys=max_keys)
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

    # echo and round_trips as Endpoint's, with rdv.send and rdv.recv called
    # in the loop as a program would, and as the Open MPI peer's loop calls
    # comm.Send and comm.Recv: through send_one and receive_one, the round
    # trip would also time two Python calls on each side that MPI's does not.

    def echo(self, count: int) -> None:
        send, recv, inbox, outbox, timeout = self.rdv.send, self.rdv.recv, self.inbox, self.outbox, MESSAGE_TIMEOUT_S
        for _ in range(count):
            send(outbox, recv(inbox, timeout=timeout), timeout=timeout)

    def round_trips(self, payload: np.ndarray, first: int, count: int) -> List[int]:
        send, recv, inbox, outbox, timeout = self.rdv.send, self.rdv.recv, self.inbox, self.outbox, MESSAGE_TIMEOUT_S
        clock, nbytes = time.perf_counter_ns, self.nbytes
        times = []
        for number in range(first, first + count):
            stamp(payload, number)
            start = clock()
            send(outbox, payload, timeout=timeout)
            echo = recv(inbox, timeout=timeout)
            times.append(clock() - start)
            check(echo, number, nbytes)
            del echo
        return times

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

    uses_pool = False  # it writes into the arena, never from a source array

    def produce(self, count: int, first: int, pool: Pool) -> None:
        rdv, key, shape = self.rdv, self.outbox, (self.nbytes // 4,)
        for number in range(first, first + count):
            with rdv.alloc(key, shape, DATA_DTYPE, timeout=MESSAGE_TIMEOUT_S) as buffer:
                stamp(buffer, number)


def stamped_batches(pool: Pool, nbytes: int, first: int, count: int) -> Iterator[List[np.ndarray]]:
    """Messages first .. first + count - 1 of a batched producer, stamped, batch_for(nbytes) at a time."""
    batch = batch_for(nbytes)
    for start in range(first, first + count, batch):
        sources = []
        for number in range(start, min(first + count, start + batch)):
            source = pool.get(nbytes, number)
            stamp(source, number)
            sources.append(source)
        yield sources


class ShmrdvManyEndpoint(ShmrdvEndpoint):
    """shmrdv ``send_many``/``recv_many``: the producer sends BATCH messages
    per call, the consumer takes what is queued, up to BATCH_MAX, per call."""

    batched = True

    def produce(self, count: int, first: int, pool: Pool) -> None:
        rdv, key = self.rdv, self.outbox
        for sources in stamped_batches(pool, self.nbytes, first, count):
            rdv.send_many([(key, source) for source in sources], timeout=MESSAGE_TIMEOUT_S)

    def receive_batch(self) -> List[np.ndarray]:
        return self.rdv.recv_many(self.inbox, BATCH_MAX, timeout=MESSAGE_TIMEOUT_S)  # type: ignore[no-any-return]


class FasterFifoEndpoint(QueueEndpoint):
    """faster-fifo ``Queue`` (a shared-memory ring of pickled messages), one
    per direction: ``put``/``get`` as ``mp.Queue``'s, and streaming with its
    batch API, ``put_many`` of BATCH and ``get_many`` of up to BATCH_MAX."""

    batched = True

    def close(self) -> None:
        pass  # no feeder thread; the rings go with the channel's last holder

    def receive_batch(self) -> List[np.ndarray]:
        return self.inbox.get_many(timeout=MESSAGE_TIMEOUT_S, max_messages_to_get=BATCH_MAX)  # type: ignore[no-any-return]

    def produce(self, count: int, first: int, pool: Pool) -> None:
        for sources in stamped_batches(pool, self.nbytes, first, count):
            self.outbox.put_many(sources, timeout=MESSAGE_TIMEOUT_S)


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


# faster-fifo's ring: room for a batch of its largest messages
FASTER_FIFO_MAX_BYTES = 1 << 20
FASTER_FIFO_RING_BYTES = 64 << 20


def _faster_fifo_channel(context: Any) -> Tuple[Any, Any, Callable[[], None]]:
    from faster_fifo import Queue

    down, up = Queue(max_size_bytes=FASTER_FIFO_RING_BYTES), Queue(max_size_bytes=FASTER_FIFO_RING_BYTES)
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
    max_bytes: Optional[int] = None  # larger messages are not measured
    check: Optional[Callable[[], Optional[str]]] = None  # why it cannot run here, beyond requires

    def measures(self, nbytes: int) -> bool:
        return self.max_bytes is None or nbytes <= self.max_bytes

    def missing(self) -> Optional[str]:
        """Why this transport cannot run here, or None."""
        if self.check is not None:
            why = self.check()
            if why:
                return why
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                extra = {"zmq": "pip install pyzmq", "torch": "pip install torch",
                         "faster_fifo": "pip install faster-fifo"}.get(module, f"pip install {module}")
                return f"{module} is not installed ({extra})"
        return None


TRANSPORTS: Dict[str, Transport] = {
    t.name: t
    for t in [
        Transport("shmrdv", "shmrdv send/recv", ShmrdvEndpoint, _no_channel, "shmrdv"),
        Transport("shmrdv-alloc", "shmrdv alloc/recv", ShmrdvAllocEndpoint, _no_channel, "shmrdv", round_trip=False),
        Transport("shmrdv-many", "shmrdv send_many/recv_many", ShmrdvManyEndpoint, _no_channel, "shmrdv",
                  round_trip=False),
        Transport("copyto", "np.copyto (1 process)", None, _no_channel, "limit", round_trip=False),
        Transport("queue", "mp.Queue", QueueEndpoint, _queue_channel, "peer"),
        Transport("pipe", "mp.Pipe", PipeEndpoint, _pipe_channel, "peer"),
        Transport("shm-ring", "shared_memory ring", RingEndpoint, _pipe_channel, "peer"),
        Transport("zmq", "pyzmq ipc", ZmqEndpoint, _zmq_channel, "peer", requires=("zmq",)),
        Transport("torch", "torch.mp.Queue", TorchQueueEndpoint, _torch_queue_channel, "peer", requires=("torch",)),
        Transport("faster-fifo", "faster-fifo (get_many)", FasterFifoEndpoint, _faster_fifo_channel, "peer",
                  requires=("faster_fifo",), max_bytes=FASTER_FIFO_MAX_BYTES),
        Transport("mpi", "Open MPI (mpi4py)", None, _no_channel, "peer", check=mpi_p2p.missing),
    ]
}
PEERS = [name for name, t in TRANSPORTS.items() if t.kind == "peer"]


def _serve(transport_name: str, channel: Any, control: Connection) -> None:
    """A child's life: build its endpoint, then follow the parent's commands until "stop"."""
    endpoint = TRANSPORTS[transport_name].endpoint(1, channel)  # type: ignore[misc]
    pool = Pool(endpoint.batched)
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
                if prebuild and endpoint.uses_pool:
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
        if self.endpoint.batched:
            number, end, receive_batch = first, first + count, self.endpoint.receive_batch
            while number < end:
                for message in receive_batch():
                    check(message, number, nbytes)
                    number += 1
                del message
            return time.perf_counter() - start
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
        self.start_echo(count)
        times = self.endpoint.round_trips(payload, self._next_number, count)
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
        self._pool = Pool()


def open_peer(name: str, child_cpu: int, lifetime_s: int = CHILD_LIFETIME_S) -> Any:
    """A Peer (or LocalCopy for "copyto") for transport `name`."""
    transport = TRANSPORTS[name]
    if transport.endpoint is None:
        return LocalCopy()
    return Peer(transport, child_cpu, lifetime_s)
