"""Unit tests of single layers of the C core, each built under AddressSanitizer and UBSan
with only the csrc/ files of its own layer and the layers below it: that the link
succeeds shows the layer does not call up. Liveness is faked through the handle's
rdv_ops, and the segments live on memfds (nothing is left in /dev/shm)."""
import pytest

from ..conftest import ROOT, build_sanitized, run_c_program

pytestmark = pytest.mark.slow

BELOW_LAYER_4 = ["rdv_os.c", "rdv_wait.c", "rdv_segment.c", "rdv_live.c", "rdv_lock.c"]


def _build_and_run(tmp_path, name: str, layer: str, timeout: float, below=BELOW_LAYER_4):
    exe = tmp_path / name
    build_sanitized(ROOT / "tests" / "c" / f"{name}.c", exe, sources=[*below, layer])
    run = run_c_program(exe, f"t-cunit-{name}", timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@pytest.mark.timeout(300)
def test_arena_unit(tmp_path):
    """Random alloc/free against an invariant checker, order independence, a holder killed
    before each store of a step (and of the repair after it), SIGKILL loops, positions, runs,
    allocation numbers unique across handles and threads."""
    run = _build_and_run(tmp_path, "unit_arena", "rdv_arena.c", timeout=180)
    for part in ("positions: ok", "runs:", "numbers:", "random: 200000 steps", "kill loop: 200 kills", "all passed"):
        assert f"unit_arena: {part}" in run.stdout, run.stdout


@pytest.mark.timeout(120)
def test_index_unit(tmp_path):
    """The key hash as defined, insert, find, delete, tombstones, a full index, concurrent
    inserts, dead lock holders."""
    run = _build_and_run(tmp_path, "unit_index", "rdv_index.c", timeout=60)
    for part in ("hash: ok", "basic: ok", "tombstones: ok", "full: 64 slots, ok", "dead holder: ok", "all passed"):
        assert f"unit_index: {part}" in run.stdout, run.stdout


@pytest.mark.timeout(120)
def test_spin_unit(tmp_path):
    """A spin's clock over rdv_os.c alone: more busy tasks than CPUs cut a spin short past its
    free window (never within it), with a CPU to spare a spin runs out its budget, and no fd
    is kept open between looks."""
    run = _build_and_run(tmp_path, "unit_spin", "rdv_os.c", timeout=90, below=[])
    for part in ("crowded: ", "spare: ok", "no fd kept: ok", "all passed"):
        assert f"unit_spin: {part}" in run.stdout, run.stdout
