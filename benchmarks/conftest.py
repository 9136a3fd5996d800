"""Fixtures shared by all benchmarks: CPU placement, the peers (one spawned
child for the transport being measured, released when the benchmarks move on
to another transport and at the end of each module), rendezvous names that
never leave /dev/shm behind, the cleanup that stops every child and unlinks
every segment also when the run is interrupted (Ctrl-C, SIGTERM), and the
report of this run's figures and ratios."""

from __future__ import annotations

import os
from pathlib import Path
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from shmrdv import bench

_REPORT_KEY = pytest.StashKey[list[str]]()
_RESULTS_KEY = pytest.StashKey[bench.Results]()
# A peer's child lives while the benchmarks of its transport run (minutes): the alarm is only a safety net.
_PEER_CHILD_LIFETIME_S = 3600
# Stops this run's children and unlinks its segments on SIGTERM, Ctrl-C and exit.
_CLEANUP = bench.InterruptCleanup(bench.sweep_segments)


@pytest.fixture(scope="session", autouse=True)
def _leave_nothing_behind(pytestconfig: pytest.Config) -> Iterator[None]:
    """From the first benchmark on: SIGTERM and Ctrl-C stop every child at once
    and unwind the run; every segment is unlinked at the end (pytest_sessionfinish,
    and at exit whatever happened). Segments of earlier runs that were killed
    outright (SIGKILL, the OOM killer) are unlinked first."""
    stale = bench.sweep_stale_segments()
    if stale:
        pytestconfig.stash.setdefault(_REPORT_KEY, []).append(
            f"unlinked {len(stale)} segment(s) left by earlier runs that were killed: {stale}")
    _CLEANUP.install()
    yield
    _CLEANUP.uninstall()


@pytest.fixture(scope="session")
def shmrdv() -> ModuleType:
    module = pytest.importorskip("shmrdv")
    if not hasattr(module, "Rendezvous"):  # e.g. the bare source directory, not built yet
        pytest.skip(f"shmrdv at {module.__path__} has no Rendezvous")
    return module


@pytest.fixture(params=["apart", "same"])
def placement(request: pytest.FixtureRequest) -> Iterator[bench.Placement]:
    """Parent pinned to the first CPU, child to the second ("apart") or the first ("same").

    Override with ``@pytest.mark.parametrize("placement", ["apart"], indirect=True)``.
    """
    try:
        chosen = bench.placement(request.param)
    except ValueError as error:
        pytest.skip(str(error))
    with bench.pinned(chosen.parent_cpu):
        yield chosen


@pytest.fixture
def single_cpu() -> Iterator[int]:
    """Pin a single-process benchmark to the first CPU."""
    cpu = bench.allowed_cpus()[0]
    with bench.pinned(cpu):
        yield cpu


@pytest.fixture
def children() -> Iterator[bench.Children]:
    spawned = bench.Children()
    try:
        yield spawned
    finally:
        spawned.cleanup()


@pytest.fixture
def rdv_name() -> Iterator[str]:
    """A rendezvous name unique to this benchmark; its segment is unlinked afterwards."""
    name = f"{bench.segment_prefix()}{uuid.uuid4().hex[:12]}"
    yield name
    try:
        os.unlink(f"/dev/shm/shmrdv-{name}")
    except FileNotFoundError:
        pass


class Peers:
    """The peer (spawned child + parent endpoint) of the transport being measured.

    Consecutive benchmarks of one transport share it (a child costs a
    second or more to spawn); asking for another transport closes it first.
    So at most one child is alive, holding the source arrays and segments of
    one message size (at 256 MiB: 11 source arrays of 2.75 GiB, and the
    transport's segment), instead of one such child per transport.
    ``pytest_collection_modifyitems`` runs each module's benchmarks of a
    transport one after the other.
    """

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def get(self, name: str, child_cpu: int) -> Any:
        transport = bench.TRANSPORTS[name]
        missing = transport.missing()
        if missing:
            pytest.skip(f"{transport.label}: {missing}")
        if transport.endpoint is None and transport.kind == "peer":
            pytest.skip(f"{transport.label} runs under its own launcher: shmrdv bench measures it")
        if transport.kind == "shmrdv":
            pytest.importorskip("shmrdv")
        peer = self._open.get(name)
        if peer is None:
            self.close()  # another transport's child and segments go first
            peer = self._open[name] = bench.open_peer(name, child_cpu, _PEER_CHILD_LIFETIME_S)
        elif isinstance(peer, bench.Peer):
            peer.pin_child(child_cpu)
        return peer

    def close(self) -> None:
        errors = []
        for peer in self._open.values():
            try:
                peer.close()
            except Exception as error:  # close the others anyway
                errors.append(error)
        self._open.clear()
        if errors:
            raise errors[0]


@pytest.fixture(scope="module")
def peers() -> Iterator[Peers]:
    """The module's peers; the last one is closed when the module ends."""
    opened = Peers()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="session")
def results(pytestconfig: pytest.Config) -> bench.Results:
    """Figures of this run, in the form ``shmrdv bench`` uses; tabulated in the terminal summary."""
    return pytestconfig.stash.setdefault(
        _RESULTS_KEY, bench.Results(machine=bench.machine(), command="pytest benchmarks", mode="pytest")
    )


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> list[str]:
    """Extra lines (ratios measured in this run) printed in the terminal summary."""
    return pytestconfig.stash.setdefault(_REPORT_KEY, [])


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every benchmark is slow: pytest -m 'not slow' leaves them out (marked
    as collected, before the selection by marks)."""
    if Path(str(item.fspath)).resolve().parent == _HERE:
        item.add_marker(pytest.mark.slow)


_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each module, the benchmarks that use a peer run transport by
    transport (in the order transports first appear), so each transport's
    child is spawned once per module and released before the next one's
    (see ``Peers``). Other benchmarks keep their place."""
    start = 0
    while start < len(items):
        end = start
        module = items[start].nodeid.split("::")[0]
        while end < len(items) and items[end].nodeid.split("::")[0] == module:
            end += 1
        block = items[start:end]
        slots = [i for i, item in enumerate(block) if _peer_transport(item) is not None]
        if slots:
            order: dict[str, int] = {}
            for i in slots:
                order.setdefault(_peer_transport(block[i]), len(order))
            moved = sorted((block[i] for i in slots), key=lambda item: order[_peer_transport(item)])  # stable
            for i, item in zip(slots, moved):
                block[i] = item
            items[start:end] = block
        start = end


def _peer_transport(item: pytest.Item) -> str | None:
    """The transport of a benchmark that uses ``peers`` ("shmrdv" when it does not say)."""
    if "peers" not in getattr(item, "fixturenames", ()):
        return None
    callspec = getattr(item, "callspec", None)
    return str(callspec.params.get("transport", "shmrdv")) if callspec is not None else "shmrdv"


@pytest.hookimpl(trylast=True)  # after the teardown of every fixture (pytest's own sessionfinish)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _CLEANUP.installed:  # no benchmark ran
        return
    done = _CLEANUP.finish()
    lines = session.config.stash.setdefault(_REPORT_KEY, [])
    if done["stopped"]:
        lines.append(f"WARNING: stopped {len(done['stopped'])} process(es) still running at the end: {done['stopped']}"
                     + (f" ({len(done['killed'])} killed)" if done["killed"] else ""))
    if done["segments"]:
        lines.append(f"WARNING: unlinked {len(done['segments'])} leftover segment(s): {done['segments']}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    results = config.stash.get(_RESULTS_KEY, None)
    lines = config.stash.get(_REPORT_KEY, [])
    if results is not None and (results.throughput or results.round_trip or results.keys or results.processes):
        results.targets = bench.evaluate_targets(results)
        terminalreporter.section("shmrdv benchmark figures and ratios (same run)")
        for line in bench.markdown(results).splitlines():
            terminalreporter.write_line(line)
    if lines:
        terminalreporter.section("shmrdv benchmark ratios (same run)")
        for line in lines:
            terminalreporter.write_line(line)

