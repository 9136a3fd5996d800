"""Fixtures shared by all benchmarks: CPU placement, child processes,
rendezvous names that never leave /dev/shm behind, and the ratio report."""

from __future__ import annotations

import glob
import os
import uuid
from collections.abc import Iterator
from types import ModuleType

import pytest

from .harness import Children, Placement, allowed_cpus, pinned

# Every segment this session creates starts with this, so a final sweep can
# find whatever a crashed benchmark left behind.
_SESSION_PREFIX = f"bench-{os.getpid()}-"
_REPORT_KEY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def shmrdv() -> ModuleType:
    module = pytest.importorskip("shmrdv")
    if not hasattr(module, "Rendezvous"):  # e.g. the bare source directory, not built yet
        pytest.skip(f"shmrdv at {module.__path__} has no Rendezvous")
    return module


@pytest.fixture(params=["apart", "same"])
def placement(request: pytest.FixtureRequest) -> Iterator[Placement]:
    """Parent pinned to the first CPU, child to the second ("apart") or the first ("same").

    Override with ``@pytest.mark.parametrize("placement", ["apart"], indirect=True)``.
    """
    cpus = allowed_cpus()
    if request.param == "apart":
        if len(cpus) < 2:
            pytest.skip("placement 'apart' needs 2 CPUs")
        chosen = Placement("apart", parent_cpu=cpus[0], child_cpu=cpus[1])
    elif request.param == "same":
        chosen = Placement("same", parent_cpu=cpus[0], child_cpu=cpus[0])
    else:
        raise ValueError(f"unknown placement {request.param!r}")
    with pinned(chosen.parent_cpu):
        yield chosen


@pytest.fixture
def single_cpu() -> Iterator[int]:
    """Pin a single-process benchmark to the first CPU."""
    cpu = allowed_cpus()[0]
    with pinned(cpu):
        yield cpu


@pytest.fixture
def children() -> Iterator[Children]:
    spawned = Children()
    try:
        yield spawned
    finally:
        spawned.cleanup()


@pytest.fixture
def rdv_name() -> Iterator[str]:
    """A rendezvous name unique to this benchmark; its segment is unlinked afterwards."""
    name = f"{_SESSION_PREFIX}{uuid.uuid4().hex[:12]}"
    yield name
    _unlink_segment(f"/dev/shm/shmrdv-{name}")


def _unlink_segment(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> list[str]:
    """Lines (ratios measured in this run) printed in the terminal summary."""
    return pytestconfig.stash.setdefault(_REPORT_KEY, [])


def pytest_sessionfinish(session: pytest.Session) -> None:
    leftovers = glob.glob(f"/dev/shm/shmrdv-{_SESSION_PREFIX}*")
    for path in leftovers:
        _unlink_segment(path)
    if leftovers:
        session.config.stash.setdefault(_REPORT_KEY, []).append(
            f"WARNING: unlinked {len(leftovers)} leftover segment(s): {leftovers}"
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(_REPORT_KEY, [])
    if lines:
        terminalreporter.section("shmrdv benchmark ratios (same run)")
        for line in lines:
            terminalreporter.write_line(line)
