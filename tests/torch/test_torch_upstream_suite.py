"""PyTorch's own distributed test suite against the "shmrdv" backend.

The cases are those of ``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py`` (shipped in the
torch wheel), run through PyTorch's own harness (``TestDistBackend``, a
``MultiProcessTestCase``: one process per rank, a FileStore, its barrier
and its timeouts) as upstream's ``test/distributed/test_distributed_spawn.py``
runs them per backend; ``upstream_suite.py`` is that runner. Every case runs
at world size 2, 3 and 4, and at 4 as two simulated hosts of two ranks
(``SHMRDV_TEST_HOST_ID`` = rank // 2, set in each rank before it joins).

Which tests run, and how: as for gloo. The suite gates most tests on the
backend's name (``skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)``,
``BACKEND not in DistTestCases.backend_feature["ddp"]``) and reads it at
import; a backend it does not know would be skipped out of most of it (DDP,
subgroups, send/recv from any source, sparse all_reduce, monitored_barrier),
and its test bodies pick gloo's CPU path by ``if BACKEND == "gloo"``. So
the suite is imported with ``BACKEND=gloo`` (what ``test_distributed_spawn.py``
is given for gloo) and selects exactly gloo's tests; in each rank the
name the tests pass to torch is then "shmrdv", taking gloo's branches
(``upstream_suite.PlaysGloo``). shmrdv thus runs every case gloo runs, with
the same inputs, and is judged by the same asserts. A case the suite
skips for gloo here (CUDA, NCCL, MPI, an exact world size) is skipped with
upstream's reason; ``SHMRDV_SKIPS`` lists the few skipped for shmrdv alone,
each with its reason.

``SHMRDV_SUITE_BACKEND=gloo`` runs the same harness on gloo: the reference.

Two sets:

* the default run: ``DEFAULT_CASES``, a few dozen cases covering every
  collective the suite runs for gloo on CPU (its CPU all_to_all is MPI's
  alone), point-to-point, DistributedDataParallel, new_group and async_op,
  at world size 2 and on two hosts: about 1.5 minutes on 2 CPUs (marked
  slow, as every multi-process torch run: CI runs it, `-m "not slow"` not);
* the full set (every case at every world size, beyond the default ones):
  marked slow, and run only with ``SHMRDV_SUITE=full`` (its cases are
  skipped, saying so, without it): about 10 minutes on 2 CPUs, gloo's 5.

``EXPECTED_FAILURES`` (and ``EXPECTED_FAILURES_AT`` for one configuration)
lists the cases that fail for shmrdv until the backend's work (issue 42)
lands, each with its cause; they are strict xfails, so a case that starts
passing fails this file until it leaves the list.

How it runs: each configuration's cases run in one runner process
(``upstream_suite``: the suite's import costs seconds of CPU), started by
the first of them, whose ranks fork from a forkserver that imported torch
once. Where root and unshare(1) allow, a runner has a /dev/shm of its own
(a mount namespace), so a case's leftovers are surely its own. Each case
waits at most its harness timeout for its result; group segments a case
leaves and processes a runner leaves fail the test.

Reproduce one case (the ids are ``<config>-<case>``)::

    SHMRDV_SUITE=full pytest "tests/torch/test_torch_upstream_suite.py::test_upstream_case_full[ws3-test_isend]"
    SHMRDV_SUITE=full SHMRDV_SUITE_BACKEND=gloo pytest tests/torch/test_torch_upstream_suite.py -k ws3-
"""
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)
pytest.importorskip("expecttest", reason="torch's test harness (torch.testing._internal) needs expecttest")

from ..conftest import process_stats  # noqa: E402
from . import upstream_suite_names as names  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BACKEND = os.environ.get("SHMRDV_SUITE_BACKEND", "shmrdv")
FULL = os.environ.get("SHMRDV_SUITE") == "full"
# How long one case's ranks may run before the harness kills them (upstream's default is 300 s).
CASE_TIMEOUT_S = 120
# Importing torch and the suite in a runner, on a busy machine.
RUNNER_START_S = 180
# What a case may take beyond its harness timeout to be reported (killing ranks, sweeping /dev/shm).
REPORT_GRACE_S = 60


@dataclass(frozen=True)
class Config:
    world: int
    hosts: int = 1


CONFIGS = {"ws2": Config(2), "ws3": Config(3), "ws4": Config(4), "2x2": Config(4, hosts=2)}

DEFAULT_CASES = {
    # Each runs for gloo on a CPU-only host at its world size. What does not:
    # the suite's CPU all_to_all is MPI's alone; its DDP hook-parity and
    # uneven-input tests need GPUs; its *_group cases (a group of ranks 1
    # and 2) need a world size of 8 (skip_if_small_worldsize).
    "ws2": [
        # names, groups, barrier
        "test_get_rank", "test_get_backend", "test_Backend_enum_class", "test_get_rank_size_group",
        "test_destroy_group", "test_barrier",
        # collectives, sync and async
        "test_broadcast", "test_reduce_sum", "test_reduce_max", "test_all_reduce_sum", "test_all_reduce_sum_async",
        "test_all_reduce_sum_complex", "test_all_reduce_product", "test_all_reduce_full_group_min",
        "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_full_group_max", "test_scatter",
        "test_scatter_checks", "test_gather", "test_gather_checks", "test_all_gather", "test_all_gather_full_group",
        "test_all_gather_coalesced_simple", "test_sparse_all_reduce_sum", "test_barrier_timeout_full_group",
        "test_monitored_barrier_gloo_rank_0_timeout",
        # objects, through new_group too
        "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_scatter_object_list",
        # point-to-point
        "test_send_recv", "test_send_recv_any_source", "test_isend", "test_irecv", "test_batch_isend_irecv_gloo",
        # DistributedDataParallel
        "test_DistributedDataParallelCPU", "test_DistributedDataParallel_requires_grad",
        "test_accumulate_gradients_no_sync_allreduce_hook", "test_get_future",
    ],
    # two hosts of two ranks: shared memory within each, gloo between them
    "2x2": [
        "test_barrier", "test_broadcast", "test_all_reduce_sum", "test_all_reduce_full_group_sum", "test_all_gather",
        "test_gather", "test_scatter", "test_send_recv", "test_DistributedDataParallelCPU",
    ],
}

_GLOO_ONLY_MONITORED_BARRIER = ("gloo-only API by torch's own check: dist.monitored_barrier raises ValueError for "
                                 "any backend but gloo; shmrdv's is shmrdv.torch.monitored_barrier (the group's own "
                                 "method runs in test_monitored_barrier_gloo_rank_0_timeout)")

SHMRDV_SKIPS: Dict[str, str] = {
    "test_monitored_barrier_gloo": _GLOO_ONLY_MONITORED_BARRIER,
    "test_monitored_barrier_gloo_subgroup": _GLOO_ONLY_MONITORED_BARRIER,
    "test_monitored_barrier_failure_order": _GLOO_ONLY_MONITORED_BARRIER,
    "test_monitored_barrier_wait_all_ranks": _GLOO_ONLY_MONITORED_BARRIER,
}
"""Cases the suite runs for gloo that are skipped for shmrdv, with the reason."""

EXPECTED_FAILURES: Dict[str, str] = {
}
"""Cases that fail for shmrdv at every world size until the backend work
of issue 42 lands: name -> cause. Strict: a case that passes fails the run.
Empty since the backend's point-to-point, sparse, coalesced and barrier
wording work: every case gloo runs here passes for shmrdv, but for
SHMRDV_SKIPS."""

EXPECTED_FAILURES_AT: Dict[Tuple[str, str], str] = {
}
"""As EXPECTED_FAILURES, for one configuration only: (config, name) -> cause."""


# ---- the runner of one configuration ----

# Runs a command in a mount namespace of its own with a fresh tmpfs on
# /dev/shm: a case's segments are then told apart from other jobs' on the
# machine for sure, and whatever is left goes with the namespace.
_PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "private-shm"]


@functools.lru_cache(maxsize=None)
def _private_shm_works() -> bool:
    """Whether _PRIVATE_SHM can run here (it needs root and unshare(1));
    without it a runner shares the machine's /dev/shm, and only reports
    the segments a case seems to leave."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*_PRIVATE_SHM, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class Runner:
    """One ``upstream_suite`` process running a configuration's cases in
    order; ``result(case)`` waits for a case's end event (see the protocol in
    ``upstream_suite``'s docstring)."""

    config_id: str
    cases: List[str]
    log: Path
    process: Optional[subprocess.Popen] = None
    results: Dict[str, dict] = field(default_factory=dict)
    started: Dict[str, Tuple[float, int]] = field(default_factory=dict)
    """case -> (when it started here, its harness timeout in seconds)."""
    begun: float = 0.0
    _read_fd: int = -1
    _buffer: bytes = b""

    @property
    def ended(self) -> bool:
        return self.process is not None and self._read_fd < 0

    def start(self) -> None:
        config = CONFIGS[self.config_id]
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, BACKEND="gloo", WORLD_SIZE=str(config.world), SHMRDV_SUITE_BACKEND=BACKEND,
                   SHMRDV_SUITE_HOSTS=str(config.hosts), DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(CASE_TIMEOUT_S),
                   SHMRDV_SUITE_RESULTS_FD=str(write_fd), GLOO_SOCKET_IFNAME="lo",
                   PYTORCH_PRINT_REPRO_ON_FAILURE="0")
        argv = [sys.executable, "-c", "from tests.torch.upstream_suite import main; main()"]
        if _private_shm_works():
            env["SHMRDV_SUITE_PRIVATE_SHM"] = "1"
            argv = [*_PRIVATE_SHM, *argv]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self._read_fd = read_fd
        self.begun = time.monotonic()
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(self.cases).encode())
        self.process.stdin.close()

    def result(self, case: str) -> dict:
        """The case's end event; a failed one made up here when the runner
        ended without running it or a case overran its harness timeout (the
        runner is then stopped)."""
        if self.process is None:
            self.start()
        while case not in self.results and not self.ended:
            deadline = self._deadline()
            ready, _, _ = select.select([self._read_fd], [], [], max(0.0, min(1.0, deadline - time.monotonic())))
            if ready:
                chunk = os.read(self._read_fd, 65536)
                if chunk:
                    self._take(chunk)
                else:  # the runner closed its end: done, or dead
                    self._wait()
            elif time.monotonic() > deadline:
                self.stop()
                self._lose(self._running() or case, "no result within its harness timeout; the runner was stopped")
        if case not in self.results:
            self._lose(case, f"the runner ended (exit {self.process.returncode}) before reporting it")
        return self.results[case]

    def _running(self) -> Optional[str]:
        return next((c for c in self.started if c not in self.results), None)

    def _deadline(self) -> float:
        running = self._running()
        if running is not None:
            began, timeout = self.started[running]
            return began + timeout + REPORT_GRACE_S
        return max((t for t, _ in self.started.values()), default=self.begun) + RUNNER_START_S

    def _take(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event["event"] == "start":
                self.started[event["case"]] = (time.monotonic(), int(event["timeout"]))
            else:
                self.results[event["case"]] = event

    def _lose(self, case: str, why: str) -> None:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        self.results[case] = {"case": case, "outcome": "failed", "leaked": [],
                              "detail": f"{why}; the runner's log {self.log} ends:\n{tail}"}

    def _wait(self) -> None:
        assert self.process is not None
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        self.stop()

    def stop(self) -> None:
        """End the runner and everything it started (its session: the
        forkserver, ranks, the resource tracker)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        if self.process is not None:
            _kill_session(self.process.pid, grace_s=0.0)
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1


def _session_members(sid: int) -> List[int]:
    """The live processes of session sid."""
    return [pid for pid, fields in process_stats() if int(fields[3]) == sid and fields[0] != "Z"]


def _kill_session(sid: int, grace_s: float = 10.0) -> List[int]:
    """Kill what is left of session sid once grace_s has passed (a runner's
    resource tracker exits a moment after it); return those killed."""
    deadline = time.monotonic() + grace_s
    while _session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _session_members(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


class Runners:
    """The runners of this module, one per configuration, started on first
    use with the cases of that configuration this session selected; one that
    ended early is replaced by one for the cases it did not reach."""

    def __init__(self, session, tmp: Path) -> None:
        self._session = session
        self._tmp = tmp
        self._runners: Dict[str, Runner] = {}

    def result(self, config_id: str, case: str) -> dict:
        runner = self._runners.get(config_id)
        if runner is None or (runner.ended and case not in runner.results):
            reached = set(runner.results) | set(runner.started) if runner is not None else set()
            cases = [c for c in self._selected(config_id) if c not in reached]
            if case not in cases:
                cases.insert(0, case)
            runner = Runner(config_id, cases, self._tmp / f"runner-{BACKEND}-{config_id}-{len(reached)}.log")
            self._runners[config_id] = runner
        return runner.result(case)

    def _selected(self, config_id: str) -> List[str]:
        selected = []
        for item in self._session.items:
            params = getattr(getattr(item, "callspec", None), "params", {})
            if params.get("config_id") == config_id and _runs(item):
                selected.append(params["case"])
        return selected

    def close(self) -> List[int]:
        """Wait for the runners to end; return the processes of theirs that
        were still running (killed)."""
        left = []
        for runner in self._runners.values():
            if runner.process is None:
                continue
            if set(runner.cases) <= set(runner.results):  # all reported: it is on its way out
                try:
                    runner.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    left.append(runner.process.pid)
                left += _kill_session(runner.process.pid)
            runner.stop()  # the session stopped early (-x, an interrupt): so does the runner
        return left


def _runs(item) -> bool:
    return not any(m.name == "skip" or (m.name == "skipif" and m.args and m.args[0])
                   for m in item.iter_markers())


@pytest.fixture(scope="module")
def runners(request, tmp_path_factory):
    every = Runners(request.session, tmp_path_factory.mktemp("upstream-suite"))
    yield every
    left = every.close()
    assert not left, f"processes of the suite's runners still running (killed): {left}"


# ---- the cases ----

def _marks(config_id: str, case: str) -> list:
    marks = [pytest.mark.timeout(RUNNER_START_S + CASE_TIMEOUT_S + REPORT_GRACE_S + 600)]
    if BACKEND != "shmrdv":
        return marks
    if case in SHMRDV_SKIPS:
        marks.append(pytest.mark.skip(reason=SHMRDV_SKIPS[case]))
    cause = EXPECTED_FAILURES_AT.get((config_id, case)) or EXPECTED_FAILURES.get(case)
    if cause:
        marks.append(pytest.mark.xfail(strict=True, reason=cause))
    return marks


def _params(full: bool) -> list:
    params = []
    for config_id in CONFIGS:
        default = DEFAULT_CASES.get(config_id, [])
        for case in (names.suite_cases() if full else default):
            if full and case in default:
                continue
            marks = _marks(config_id, case) + [pytest.mark.slow]  # multi-process torch runs: not the inner loop
            if full:
                marks += [pytest.mark.skipif(not FULL, reason="the full suite runs with SHMRDV_SUITE=full")]
            params.append(pytest.param(config_id, case, id=f"{config_id}-{case}", marks=marks))
    return params


def _check(result: dict) -> None:
    leaked = result.get("leaked") or []
    if result["outcome"] == "skipped":
        pytest.skip(f"upstream: {result['detail']}")
    if result["outcome"] == "failed":
        pytest.fail(f"{names.error_line(result['detail'])}\n\n{result['detail']}", pytrace=False)
    assert not leaked, f"group segments left in /dev/shm: {leaked}"


@pytest.mark.parametrize("config_id, case", _params(full=False))
def test_upstream_case(runners, config_id, case):
    _check(runners.result(config_id, case))


@pytest.mark.parametrize("config_id, case", _params(full=True))
def test_upstream_case_full(runners, config_id, case):
    _check(runners.result(config_id, case))


def test_named_cases_exist_in_the_installed_suite():
    """Every case named here exists in the installed torch's suite."""
    every = set(names.suite_cases())
    named = {c for cases in DEFAULT_CASES.values() for c in cases} | set(SHMRDV_SKIPS) | set(EXPECTED_FAILURES)
    named |= {c for _, c in EXPECTED_FAILURES_AT}
    assert named - every == set()
    assert {config_id for config_id, _ in EXPECTED_FAILURES_AT} <= set(CONFIGS)
