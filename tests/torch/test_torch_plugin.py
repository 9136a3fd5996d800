"""init_process_group("shmrdv") with no import of shmrdv.torch: torch runs
the package's ``torch.backends`` entry point at ``import torch``, which
registers the name and nothing more (shmrdv itself loads when a group is
made)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

_PROGRAM = """
import sys
import torch
import torch.distributed as dist
assert not [m for m in sys.modules if m == "shmrdv" or m.startswith("shmrdv.")], "import torch loaded shmrdv"
dist.init_process_group("shmrdv", rank=0, world_size=1, store=dist.HashStore())
t = torch.ones(3)
dist.all_reduce(t)
assert "shmrdv.torch.backend" in sys.modules
print(type(dist.group.WORLD).__name__, t.tolist())
dist.destroy_process_group()
"""


def test_the_backend_needs_no_import_of_its_own():
    run = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ProcessGroupShmrdv", "[1.0,", "1.0,", "1.0]"]


def test_shmrdv_init_method_needs_no_import_either(tmp_path):
    program = f"""
import sys
import torch
import torch.distributed as dist
dist.init_process_group("shmrdv", init_method="shmrdv://plugin-{os.getpid()}", rank=0, world_size=1)
t = torch.ones(2)
dist.all_reduce(t)
print(type(dist.distributed_c10d._get_default_store()).__name__)
dist.destroy_process_group()
"""
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, SHMRDV_DIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert "Store" in run.stdout
    assert not list(tmp_path.iterdir()), "the job's last member removes its Store"


def test_without_torchs_autoload_the_name_is_unknown_until_imported():
    env_program = _PROGRAM.replace('dist.init_process_group', 'import shmrdv.torch\ndist.init_process_group')
    env_program = env_program.replace('assert "shmrdv.torch.backend" in sys.modules\n', "")
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    unknown = subprocess.run([sys.executable, "-c", "import torch.distributed as dist\n"
                              "dist.init_process_group('shmrdv', rank=0, world_size=1, store=dist.HashStore())"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert unknown.returncode != 0 and "shmrdv" in unknown.stderr.lower()
    known = subprocess.run([sys.executable, "-c", env_program], capture_output=True, text=True, timeout=120, env=env)
    assert known.returncode == 0, known.stderr
