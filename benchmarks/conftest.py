"""Fixtures shared by all benchmarks: CPU placement, the peers (one spawned
child per transport for the whole session), rendezvous names that never leave
/dev/shm behind, and the report of this run's figures and ratios."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from shmrdv import bench

_REPORT_KEY = pytest.StashKey[list[str]]()
_RESULTS_KEY = pytest.StashKey[bench.Results]()
# Session children live as long as the session: the alarm is only a safety net.
_SESSION_CHILD_LIFETIME_S = 4 * 3600


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
    """One peer (spawned child + parent endpoint) per transport, started when first asked for."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def get(self, name: str, child_cpu: int) -> Any:
        transport = bench.TRANSPORTS[name]
        missing = transport.missing()
        if missing:
            pytest.skip(f"{transport.label}: {missing}")
        if transport.kind == "shmrdv":
            pytest.importorskip("shmrdv")
        peer = self._open.get(name)
        if peer is None:
            peer = self._open[name] = bench.open_peer(name, child_cpu, _SESSION_CHILD_LIFETIME_S)
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


@pytest.fixture(scope="session")
def peers() -> Iterator[Peers]:
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    leftovers = bench.sweep_segments()
    if leftovers:
        session.config.stash.setdefault(_REPORT_KEY, []).append(
            f"WARNING: unlinked {len(leftovers)} leftover segment(s): {leftovers}"
        )


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

