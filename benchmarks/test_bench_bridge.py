"""The TCP bridge over loopback, side by side with a bare socket pair between
two processes: groups ``bridge-64MiB`` (one-way throughput of 64 MiB float32
tensors) and ``bridge-rtt-64B`` (64 B round trip).

shmrdv runs two rendezvous on this machine as two hosts, A and B, each served
by its own ``python -m shmrdv bridge`` process: a send on one with a TF key
routed to the other's job goes sender → outbox → its bridge → TCP → the other
bridge → the other rendezvous, where an ordinary ``recv`` takes it. The
parent and the child are pinned apart, as the socket pair's two ends are.
``shmrdv``: each host gets one CPU, its bridge is pinned with the process on
it (throughput: the sending child and bridge A on the second CPU, the
receiving parent and bridge B on the first; round trip: the parent and bridge
A on the first, the echoing child and bridge B on the second), so the sending
host's two copies (into the outbox, into the socket) share one CPU.
``shmrdv-bridges-any-cpu``: both bridges may run on either CPU, as on hosts
with a core to spare.

A round moves a batch of messages (throughput) or one round trip; every
message's number is checked in its first and last element. The ratios
shmrdv ÷ socket pair of this run are printed in the terminal summary; the
issue's target for 64 MiB is ≥ 0.7x.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from statistics import median

import numpy as np
import pytest

from shmrdv import bench

from .harness import DISABLED_MAX_BYTES, MESSAGE_TIMEOUT_S, MiB, format_time, planned_calls, timings

pytestmark = pytest.mark.parametrize("placement", ["apart"], indirect=True)

THROUGHPUT_BYTES = 64 * MiB
MESSAGES_PER_ROUND = 8
THROUGHPUT_ROUNDS = 10
# Two passes over each 512 MiB arena: every page touched before timing.
THROUGHPUT_WARMUP_ROUNDS = 2
ROUND_TRIP_BYTES = 64
ROUND_TRIP_ROUNDS = 1000
ROUND_TRIP_WARMUP_ROUNDS = 100
THROUGHPUT_TARGET = 0.7

DEV_A = "/job:a/replica:0/task:0/device:CPU:0"
DEV_B = "/job:b/replica:0/task:0/device:CPU:0"
# Bridges import numpy: without these, OpenBLAS starts a spinning thread that pinning does not cover.
_BRIDGE_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_DRAIN_TIMEOUT_S = 2
# A bridge gets SIGTERM (its orderly stop) if this process dies without
# stopping it (SIGKILL, the OOM killer): PR_SET_PDEATHSIG, set by this stub,
# which then execs the bridge (no preexec_fn in a process with threads).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the benchmark ended before its bridge started')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def message_keys(src: str, dst: str, name: str, count: int) -> list[str]:
    """The TF keys of messages 0 … count-1 (one frame iteration each), built before any timing."""
    import shmrdv

    return [shmrdv.create_key(src, 1, dst, name, (0, number)) for number in range(count)]


def arena_bytes(nbytes: int) -> int:
    """Arena of each host's rendezvous: 8 messages (7 envelopes fit in the sender's outbox)."""
    return max(16 * MiB, 8 * nbytes)


# ---------------------------------------------------------------------------
# Two hosts on one machine: a rendezvous and a bridge process each
# ---------------------------------------------------------------------------


class BridgeProcess:
    """``python -m shmrdv bridge`` serving one rendezvous, its threads on `cpus` only;
    it stops (SIGTERM) if this process dies first."""

    def __init__(self, name: str, cpus: set[int], token_file: Path, log_path: Path) -> None:
        self.log_path = log_path
        command = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()),
                   "-m", "shmrdv", "bridge", "--name", name, "--listen", "127.0.0.1:0",
                   "--token-file", str(token_file), "--drain-timeout", str(_DRAIN_TIMEOUT_S), "--log-level", "WARNING"]
        # The bridge, and every thread it starts, inherits the affinity of the thread that starts it.
        previous = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
        try:
            with open(log_path, "ab") as log:
                self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **_BRIDGE_ENV})
        finally:
            os.sched_setaffinity(0, previous)
        try:
            self.url = f"tcp://{self._listening_address()}"
        except BaseException:
            self.stop()
            raise

    def _listening_address(self) -> str:
        """HOST:PORT from the bridge's one line on stdout, ``listening HOST:PORT``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + bench.STARTUP_TIMEOUT_S
        line = b""
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise AssertionError(f"bridge did not start within {bench.STARTUP_TIMEOUT_S} s: {self.log()}")
                chunk = os.read(self.proc.stdout.fileno(), 256)
                if not chunk:
                    raise AssertionError(f"bridge exited with {self.proc.wait(bench.JOIN_TIMEOUT_S)}: {self.log()}")
                line += chunk
        word, _, address = line.decode().strip().partition(" ")
        assert word == "listening", line
        return address

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] or "(empty log)"

    def terminate(self) -> None:
        """Ask the bridge to stop (SIGTERM); `stop` waits for it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM (acknowledged envelopes drain at once), SIGKILL if it does not end."""
        self.terminate()
        try:
            self.proc.wait(_DRAIN_TIMEOUT_S + bench.CLEANUP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(bench.CLEANUP_GRACE_S)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class Hosts:
    """Rendezvous A and B, each served by its bridge; routed sends need the token."""

    def __init__(self, names: tuple[str, str], urls: tuple[str, str], token: str) -> None:
        self.names, self.urls, self.token = names, urls, token


@contextlib.contextmanager
def two_hosts(tmp_path: Path, nbytes: int, cpus_a: set[int], cpus_b: set[int]) -> Iterator[Hosts]:
    """Hosts for messages of `nbytes`, their bridges on `cpus_a` and `cpus_b`; on
    failure the bridges' logs are added to the error.

    Both segments are unlinked and both bridges stopped (killed if need be) on the way out.
    """
    import shmrdv

    token = secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    segments: list[shmrdv.Rendezvous] = []
    bridges: list[BridgeProcess] = []
    try:
        for cpus in (cpus_a, cpus_b):
            rdv = shmrdv.Rendezvous(bench.unique_name("bridge-"), size=arena_bytes(nbytes), create=True)
            segments.append(rdv)
            bridges.append(BridgeProcess(rdv.name, cpus, token_file, tmp_path / f"{rdv.name}.log"))
        try:
            yield Hosts((segments[0].name, segments[1].name), (bridges[0].url, bridges[1].url), token)
        except BaseException as error:
            for bridge in bridges:
                error.add_note(f"bridge {bridge.url} (exit code {bridge.proc.poll()}) log:\n{bridge.log()}")
            raise
    finally:
        for bridge in bridges:  # both at once: neither sees the other go and reconnects
            bridge.terminate()
        for bridge in bridges:
            bridge.stop()
        for rdv in segments:
            rdv.unlink()
            rdv.close()


# ---------------------------------------------------------------------------
# The bare socket pair
# ---------------------------------------------------------------------------


def bound_socket(sock: socket.socket, nodelay: bool = False) -> socket.socket:
    """A blocking socket whose every send and recv gives up after MESSAGE_TIMEOUT_S.

    Kernel timeouts (SO_RCVTIMEO/SO_SNDTIMEO) rather than ``settimeout``,
    which would add a poll() to every call of the measured loop.
    """
    sock.settimeout(None)
    limit = struct.pack("ll", int(MESSAGE_TIMEOUT_S), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
    if nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        got = sock.recv_into(view)
        if got == 0:
            raise ConnectionError("the peer closed the socket")
        view = view[got:]


@contextlib.contextmanager
def accepted_child(children: bench.Children, cpu: int, target: Callable[..., None], *args: object,
                   nodelay: bool = False) -> Iterator[socket.socket]:
    """Start `target(port, *args)` in a child on `cpu`; yields the connection it opens to us.

    The child must end by itself (it is joined) once the body is done.
    """
    with socket.create_server(("127.0.0.1", 0)) as listener:
        child = children.start(target, listener.getsockname()[1], *args, cpu=cpu)

        def accept(timeout: float) -> socket.socket:
            listener.settimeout(timeout)
            return listener.accept()[0]

        with bound_socket(bench.wait_until_ready(child, accept), nodelay) as conn:
            yield conn
    children.join(child)


def _socket_producer(port: int, nbytes: int, count: int) -> None:
    """Child: `count` messages of `nbytes`, numbered, each sendall'ed from one numpy array."""
    source = np.ones(nbytes // 4, dtype=bench.DATA_DTYPE)
    with bound_socket(socket.create_connection(("127.0.0.1", port), timeout=bench.STARTUP_TIMEOUT_S)) as sock:
        for number in range(count):
            bench.stamp(source, number)
            sock.sendall(source.data)


def _socket_echo(port: int, nbytes: int, count: int) -> None:
    """Child: send back each of `count` messages of `nbytes`."""
    message = bytearray(nbytes)
    view = memoryview(message)
    with bound_socket(socket.create_connection(("127.0.0.1", port), timeout=bench.STARTUP_TIMEOUT_S), nodelay=True) as sock:
        for _ in range(count):
            recv_exactly(sock, view)
            sock.sendall(view)


@contextlib.contextmanager
def socket_stream(children: bench.Children, placement: bench.Placement, tmp_path: Path, nbytes: int,
                  count: int) -> Iterator[Callable[[int], np.ndarray]]:
    buffer = np.empty(nbytes // 4, dtype=bench.DATA_DTYPE)
    view = buffer.data.cast("B")
    with accepted_child(children, placement.child_cpu, _socket_producer, nbytes, count) as conn:

        def receive(number: int) -> np.ndarray:
            recv_exactly(conn, view)
            return buffer

        yield receive


@contextlib.contextmanager
def socket_round_trips(children: bench.Children, placement: bench.Placement, tmp_path: Path, nbytes: int,
                       count: int) -> Iterator[Callable[[np.ndarray, int], np.ndarray]]:
    echo = np.empty(nbytes // 4, dtype=bench.DATA_DTYPE)
    view = echo.data.cast("B")
    with accepted_child(children, placement.child_cpu, _socket_echo, nbytes, count, nodelay=True) as conn:

        def round_trip(payload: np.ndarray, number: int) -> np.ndarray:
            conn.sendall(payload.data)
            recv_exactly(conn, view)
            return echo

        yield round_trip


# ---------------------------------------------------------------------------
# shmrdv through two bridges
# ---------------------------------------------------------------------------


def _bridged_producer(name_a: str, url_b: str, token: str, nbytes: int, count: int) -> None:
    """Child on host A: a "ready" message, then `count` numbered messages of `nbytes`, all routed to B."""
    import shmrdv

    source = np.ones(nbytes // 4, dtype=bench.DATA_DTYPE)
    keys = message_keys(DEV_A, DEV_B, "tensor", count)
    with shmrdv.Rendezvous(name_a, create=False, routes={"/job:b": url_b}, token=token) as rdv:
        rdv.send(message_keys(DEV_A, DEV_B, "ready", 1)[0], np.zeros(1, dtype=bench.DATA_DTYPE), timeout=MESSAGE_TIMEOUT_S)
        for number, key in enumerate(keys):
            bench.stamp(source, number)
            rdv.send(key, source, timeout=MESSAGE_TIMEOUT_S)


def _bridged_echo(name_b: str, url_a: str, token: str, count: int) -> None:
    """Child on host B: a "ready" message to A, then send each of `count` pings back to A."""
    import shmrdv

    pings = message_keys(DEV_A, DEV_B, "ping", count)
    pongs = message_keys(DEV_B, DEV_A, "pong", count)
    with shmrdv.Rendezvous(name_b, create=False, routes={"/job:a": url_a}, token=token) as rdv:
        rdv.send(message_keys(DEV_B, DEV_A, "ready", 1)[0], np.zeros(1, dtype=bench.DATA_DTYPE), timeout=MESSAGE_TIMEOUT_S)
        for ping, pong in zip(pings, pongs):
            message = rdv.recv(ping, timeout=MESSAGE_TIMEOUT_S)
            rdv.send(pong, message, timeout=MESSAGE_TIMEOUT_S)
            del message


def bridge_cpus(placement: bench.Placement, pinned_with_host: bool) -> tuple[set[int], set[int]]:
    """CPUs of the bridges of the parent's and the child's host."""
    if pinned_with_host:
        return {placement.parent_cpu}, {placement.child_cpu}
    both = {placement.parent_cpu, placement.child_cpu}
    return both, both


@contextlib.contextmanager
def bridged_stream(children: bench.Children, placement: bench.Placement, tmp_path: Path, nbytes: int,
                   count: int, pinned_with_host: bool) -> Iterator[Callable[[int], np.ndarray]]:
    import shmrdv

    keys = message_keys(DEV_A, DEV_B, "tensor", count)
    parent_host, child_host = bridge_cpus(placement, pinned_with_host)
    with two_hosts(tmp_path, nbytes, child_host, parent_host) as hosts, \
            shmrdv.Rendezvous(hosts.names[1], create=False) as rdv:
        child = children.start(_bridged_producer, hosts.names[0], hosts.urls[1], hosts.token, nbytes, count,
                               cpu=placement.child_cpu)
        ready = message_keys(DEV_A, DEV_B, "ready", 1)[0]
        bench.wait_until_ready(child, lambda timeout: rdv.recv(ready, timeout=timeout))

        def receive(number: int) -> np.ndarray:
            return rdv.recv(keys[number], timeout=MESSAGE_TIMEOUT_S)

        yield receive
        children.join(child)


@contextlib.contextmanager
def bridged_round_trips(children: bench.Children, placement: bench.Placement, tmp_path: Path, nbytes: int,
                        count: int, pinned_with_host: bool) -> Iterator[Callable[[np.ndarray, int], np.ndarray]]:
    import shmrdv

    pings = message_keys(DEV_A, DEV_B, "ping", count)
    pongs = message_keys(DEV_B, DEV_A, "pong", count)
    with two_hosts(tmp_path, nbytes, *bridge_cpus(placement, pinned_with_host)) as hosts, \
            shmrdv.Rendezvous(hosts.names[0], create=False, routes={"/job:b": hosts.urls[1]}, token=hosts.token) as rdv:
        child = children.start(_bridged_echo, hosts.names[1], hosts.urls[0], hosts.token, count, cpu=placement.child_cpu)
        ready = message_keys(DEV_B, DEV_A, "ready", 1)[0]
        bench.wait_until_ready(child, lambda timeout: rdv.recv(ready, timeout=timeout))

        def round_trip(payload: np.ndarray, number: int) -> np.ndarray:
            rdv.send(pings[number], payload, timeout=MESSAGE_TIMEOUT_S)
            return rdv.recv(pongs[number], timeout=MESSAGE_TIMEOUT_S)

        yield round_trip
        children.join(child)


Stream = Callable[..., contextlib.AbstractContextManager[Callable[[int], np.ndarray]]]
RoundTrips = Callable[..., contextlib.AbstractContextManager[Callable[[np.ndarray, int], np.ndarray]]]
STREAMS: dict[str, Stream] = {
    "socket": socket_stream,
    "shmrdv": partial(bridged_stream, pinned_with_host=True),
    "shmrdv-bridges-any-cpu": partial(bridged_stream, pinned_with_host=False),
}
ROUND_TRIPS: dict[str, RoundTrips] = {
    "socket": socket_round_trips,
    "shmrdv": partial(bridged_round_trips, pinned_with_host=True),
    "shmrdv-bridges-any-cpu": partial(bridged_round_trips, pinned_with_host=False),
}
LABELS = {"socket": "bare socket pair", "shmrdv": "shmrdv, bridges on their host's CPU",
          "shmrdv-bridges-any-cpu": "shmrdv, bridges on any CPU"}


# ---------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def figures(report: list[str]) -> Iterator[dict[tuple[str, str], dict]]:
    """Each benchmark's extra_info by (group, transport); the shmrdv ÷ socket ratios are reported at module end."""
    measured: dict[tuple[str, str], dict] = {}
    yield measured
    bridged = [name for name in LABELS if name != "socket"]
    theirs = measured.get(("bridge-64MiB", "socket"))
    for name in bridged:
        ours = measured.get(("bridge-64MiB", name))
        if ours and theirs:
            ours["ratio_vs_socket"] = ratio = ours["GB/s"] / theirs["GB/s"]
            report.append(f"bridge-64MiB: {LABELS[name]} {ours['GB/s']:.2f} GB/s vs {LABELS['socket']} "
                          f"{theirs['GB/s']:.2f} GB/s: {ratio:.3g}x (target ≥ {THROUGHPUT_TARGET}x: "
                          f"{'met' if ratio >= THROUGHPUT_TARGET else 'NOT met'})")
    theirs = measured.get(("bridge-rtt-64B", "socket"))
    for name in bridged:
        ours = measured.get(("bridge-rtt-64B", name))
        if ours and theirs:
            ours["ratio_vs_socket"] = ratio = ours["median_us"] / theirs["median_us"]
            ours["p99_ratio_vs_socket"] = p99_ratio = ours["p99_us"] / theirs["p99_us"]
            report.append(f"bridge-rtt-64B: {LABELS[name]} median {format_time(ours['median_us'] / 1e6)} "
                          f"(p99 {format_time(ours['p99_us'] / 1e6)}) vs {LABELS['socket']} "
                          f"{format_time(theirs['median_us'] / 1e6)} (p99 {format_time(theirs['p99_us'] / 1e6)}): "
                          f"{ratio:.3g}x the socket's median, {p99_ratio:.3g}x its p99")


@pytest.mark.benchmark(group="bridge-64MiB")
@pytest.mark.parametrize("transport", list(STREAMS))
def test_bridge_throughput(benchmark, shmrdv, children, placement, tmp_path: Path, transport: str, figures: dict) -> None:
    nbytes = THROUGHPUT_BYTES if benchmark.enabled else min(THROUGHPUT_BYTES, DISABLED_MAX_BYTES)
    per_round = MESSAGES_PER_ROUND if benchmark.enabled else 1
    count = per_round * planned_calls(benchmark, THROUGHPUT_ROUNDS, THROUGHPUT_WARMUP_ROUNDS)
    numbers = itertools.count()
    with STREAMS[transport](children, placement, tmp_path, nbytes, count) as receive:

        def batch() -> None:
            for _ in range(per_round):
                number = next(numbers)
                message = receive(number)
                bench.check(message, number, nbytes)
                del message  # shmrdv: frees the block in B's arena

        benchmark.pedantic(batch, rounds=THROUGHPUT_ROUNDS, warmup_rounds=THROUGHPUT_WARMUP_ROUNDS)
    data = timings(benchmark)
    if data is not None:
        seconds = median(data)
        benchmark.extra_info.update({"GB/s": per_round * nbytes / seconds / 1e9,
                                     "messages/s": per_round / seconds, "messages/round": per_round})
        figures["bridge-64MiB", transport] = benchmark.extra_info


@pytest.mark.benchmark(group="bridge-rtt-64B")
@pytest.mark.parametrize("transport", list(ROUND_TRIPS))
def test_bridge_round_trip(benchmark, shmrdv, children, placement, tmp_path: Path, transport: str, figures: dict) -> None:
    payload = np.zeros(ROUND_TRIP_BYTES // 4, dtype=bench.DATA_DTYPE)
    numbers = itertools.count()
    count = planned_calls(benchmark, ROUND_TRIP_ROUNDS, ROUND_TRIP_WARMUP_ROUNDS)
    with ROUND_TRIPS[transport](children, placement, tmp_path, ROUND_TRIP_BYTES, count) as ping:

        def round_trip() -> None:
            number = next(numbers)
            bench.stamp(payload, number)
            bench.check(ping(payload, number), number, ROUND_TRIP_BYTES)

        benchmark.pedantic(round_trip, rounds=ROUND_TRIP_ROUNDS, warmup_rounds=ROUND_TRIP_WARMUP_ROUNDS)
    data = timings(benchmark)
    if data is not None:
        benchmark.extra_info.update({"median_us": median(data) * 1e6, "p99_us": bench.p99(data) * 1e6})
        figures["bridge-rtt-64B", transport] = benchmark.extra_info
