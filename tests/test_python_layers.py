"""The Python package's layers (docs/architecture.md): each layer imports only from the
layers below it (cli > bench > torch | loader | bridge > group | rendezvous > the core's
modules), no package has an import cycle among its modules, the core imports nothing from
the bridge, the CLI or the benchmarks, the bridge stands on the core's API, nothing imports
the CLI. import-linter checks the contracts in pyproject.toml; ``import shmrdv`` itself
loads no network modules."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT


@pytest.mark.timeout(120)
def test_import_contracts_hold():
    beside = Path(sys.executable).parent / "lint-imports"  # this interpreter's, in a virtualenv
    lint = str(beside) if beside.exists() else shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    run = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 kept, 0 broken" in run.stdout, run.stdout


@pytest.mark.timeout(60)
def test_import_shmrdv_loads_no_network_modules():
    code = "import sys, shmrdv; print(sorted(m for m in ('ssl', 'socket', 'hmac') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(60)
def test_routes_still_work_through_the_bridge_layer(rdv_name):
    code = (
        "import sys, shmrdv\n"
        f"r = shmrdv.Rendezvous({rdv_name!r}, size=1 << 20, routes={{'/job:b/replica:0/task:0': 'tcp://127.0.0.1:9'}})\n"
        "print(type(r._routes).__module__)\n"
        "r.close(); r.unlink()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "shmrdv.bridge.routing"
