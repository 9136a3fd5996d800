"""Runs cases of PyTorch's own distributed test suite
(``torch.testing._internal.distributed.distributed_test``'s
``DistributedTest._DistTestBase``) through PyTorch's own harness
(``TestDistBackend``, a ``MultiProcessTestCase``), as upstream's
``test/distributed/test_distributed_spawn.py`` does, for one backend and one
world size per process; ``test_torch_upstream_suite.py`` starts it and reads
its results.

It is a process of its own because the suite decides which tests run while
it is imported: its decorators read ``BACKEND`` and ``WORLD_SIZE`` from the
environment once, at import. So the environment is set before the import:

* ``BACKEND=gloo`` always: the suite selects and shapes its tests as it does
  for gloo (see the docstring of ``test_torch_upstream_suite.py``);
* ``SHMRDV_SUITE_BACKEND``: the backend the ranks actually use, ``shmrdv``
  or ``gloo`` (the reference);
* ``WORLD_SIZE``, and ``SHMRDV_SUITE_HOSTS`` (1, or 2 for two simulated
  hosts: rank r gets ``SHMRDV_TEST_HOST_ID=r // (WORLD_SIZE / 2)``);
* ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``: how long the harness lets one
  case's ranks run before it kills them and fails the case.

The case names arrive as a JSON list on stdin; one JSON line per event goes
to the file descriptor ``SHMRDV_SUITE_RESULTS_FD``: ``{"case", "event":
"start", "timeout"}`` when a case starts, ``{"case", "event": "end",
"outcome", "detail", "seconds", "leaked"}`` when it ends (outcome
``passed``, ``skipped``, ``failed``; detail the skip reason or the
traceback; leaked the group segments it left in /dev/shm).
``SHMRDV_SUITE_PRIVATE_SHM=1`` says the runner has a /dev/shm of its own
(a mount namespace with a fresh tmpfs there), so what a case leaves there
is surely its own, and is removed.

Ranks are forked from a forkserver that has imported torch and the suite
once, instead of spawned fresh (upstream's ``_spawn_processes``): importing
torch costs seconds of CPU per rank, forking it does not. The environment a
rank needs from the parent (the harness sets ``TEMP_DIR`` and
``INIT_METHOD`` per case) is handed to it explicitly, since a forkserver's
children inherit the server's environment, not the parent's.
``SHMRDV_SUITE_START=spawn`` starts ranks exactly as upstream does.
"""
import json
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import time
import unittest
import warnings

BACKEND_ENV = "SHMRDV_SUITE_BACKEND"
HOSTS_ENV = "SHMRDV_SUITE_HOSTS"
RESULTS_FD_ENV = "SHMRDV_SUITE_RESULTS_FD"
START_ENV = "SHMRDV_SUITE_START"
PRIVATE_SHM_ENV = "SHMRDV_SUITE_PRIVATE_SHM"  # "1": this runner has a /dev/shm of its own
TEST_HOST_ENV = "SHMRDV_TEST_HOST_ID"  # shmrdv.torch.hosts.TEST_HOST_ENV, without importing torch here
# What a rank takes from the parent's environment as it is when the rank starts.
_PASSED_ENV = ("TEMP_DIR", "INIT_METHOD", "MASTER_ADDR", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG")
# A leaked group of this backend: its segment stays after every rank has left.
_LEAK_GRACE_S = 2.0

from torch.testing._internal.distributed import distributed_test
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend


class PlaysGloo(str):
    """The backend name "shmrdv" that compares equal to "gloo" as well.

    The suite's test bodies choose what to run by comparing ``BACKEND``
    with a backend's name (``if BACKEND == "gloo"``: the CPU model of a DDP
    test) and pass ``BACKEND`` wherever a backend is named
    (``init_process_group(backend=BACKEND)``, ``assertEqual(get_backend(),
    BACKEND.lower())``). This value takes gloo's branches and names shmrdv.
    Sets and dicts hash it as "shmrdv"."""

    def __eq__(self, other: object) -> bool:
        return other == "gloo" or str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _backend() -> str:
    return os.environ.get(BACKEND_ENV, "shmrdv")


class TestDistBackendUpstream(TestDistBackend, DistributedTest._DistTestBase):
    """Upstream's ``TestDistBackendWithSpawn``: the suite's tests on
    ``TestDistBackend``'s ranks, with the backend and hosts set in each rank."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _spawn_processes(self) -> None:
        if os.environ.get(START_ENV) == "spawn":
            super()._spawn_processes()
            return
        context = multiprocessing.get_context("forkserver")
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}

        def process(**kwargs):
            kwargs["kwargs"] = dict(kwargs.get("kwargs", {}), parent_env=env)
            return context.Process(**kwargs)

        self._start_processes(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, parent_env=None, **kwargs):
        os.environ.update(parent_env or {})
        world = int(os.environ["WORLD_SIZE"])
        hosts = int(os.environ.get(HOSTS_ENV, "1"))
        if hosts > 1:
            os.environ[TEST_HOST_ENV] = str(rank // (world // hosts))
        if _backend() == "shmrdv":
            import shmrdv.torch  # noqa: F401  (registers the backend in this rank)

            distributed_test.BACKEND = PlaysGloo("shmrdv")
        super()._run(rank, test_name, file_name, pipe, **kwargs)


def _group_segments() -> set:
    """This backend's groups in /dev/shm (shmrdv names them torch-<random>)."""
    return {e for e in os.listdir("/dev/shm") if e.startswith("shmrdv") and "torch-" in e}


def _left_behind(before: set) -> list:
    """The group segments that appeared during a case and are still there
    once its ranks are gone. In a /dev/shm of the runner's own
    (``PRIVATE_SHM_ENV``) they can only be the case's: they are removed.
    In the machine's they may be another job's, appeared meanwhile: they are
    only reported."""
    deadline = time.monotonic() + _LEAK_GRACE_S
    while _group_segments() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    leaked = sorted(_group_segments() - before)
    if os.environ.get(PRIVATE_SHM_ENV) == "1":
        for entry in leaked:
            try:
                os.unlink(os.path.join("/dev/shm", entry))
            except FileNotFoundError:
                pass
    return leaked


def _outcome(result: unittest.TestResult):
    if result.failures or result.errors:
        return "failed", "\n".join(text for _, text in result.failures + result.errors)
    if result.skipped:
        return "skipped", "; ".join(reason for _, reason in result.skipped)
    return "passed", ""


def run_case(name: str, report) -> None:
    from torch.testing._internal.common_distributed import get_timeout

    case = TestDistBackendUpstream(name)
    report({"case": name, "event": "start", "timeout": get_timeout(case.id())})
    before = _group_segments()
    started = time.monotonic()
    result = unittest.TestResult()
    case.run(result)
    seconds = time.monotonic() - started
    outcome, detail = _outcome(result)
    try:
        os.unlink(case.file_name)  # the harness's FileStore file (MultiProcessTestCase leaves it)
    except (AttributeError, FileNotFoundError):
        pass
    report({"case": name, "event": "end", "outcome": outcome, "detail": detail, "seconds": round(seconds, 2),
            "leaked": _left_behind(before)})


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)
    names = json.load(sys.stdin)
    out = os.fdopen(int(os.environ[RESULTS_FD_ENV]), "w", buffering=1)

    def report(event: dict) -> None:
        out.write(json.dumps(event) + "\n")

    if os.environ.get(START_ENV) != "spawn":
        multiprocessing.set_forkserver_preload([__name__])
    TestDistBackendUpstream.setUpClass()
    try:
        for name in names:
            run_case(name, report)
    finally:
        TestDistBackendUpstream.tearDownClass()
        server = getattr(multiprocessing.forkserver, "_forkserver", None)
        if server is not None and hasattr(server, "_stop"):
            server._stop()
        out.close()


__all__ = ["PlaysGloo", "TestDistBackendUpstream", "main", "run_case"]
