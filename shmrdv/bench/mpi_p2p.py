"""Open MPI point to point (mpi4py ``comm.Send``/``comm.Recv`` of numpy
arrays) as a transport of ``shmrdv bench``: one ``mpirun`` of two ranks per
placement (``_mpi_p2p_worker``), shared memory only (``btl self,vader``).

Pinned apart, each rank is bound to its own core, as the other transports'
processes are; on one CPU both ranks pin themselves to it and Open MPI
yields while it polls (``mpi_yield_when_idle``), since a rank that spins
holds the CPU its peer needs. MPI busy-polls while it waits: an idle rank
burns a core, which shmrdv's waits never do (they sleep).
"""

from __future__ import annotations
import json
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from .collective_peers import _mpi_missing, launch_mpi, mpirun_command

_MARK = "mpi_p2p"
TIMEOUT_S = 300.0


def version() -> Optional[str]:
    """Open MPI's version as ``mpirun --version`` says it, or None without mpirun."""
    if shutil.which("mpirun") is None:
        return None
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.split()
    return words[3] if len(words) > 3 and words[:3] == ["mpirun", "(Open", "MPI)"] else None


def missing() -> Optional[str]:
    """Why Open MPI cannot be measured here (no mpirun, no mpi4py), or None."""
    return _mpi_missing()


def run(placement: str, cpus: Tuple[int, int], streams: List[Tuple[int, float, int]],
        round_trips: List[Tuple[int, float, int, int]], timeout_s: float = TIMEOUT_S) -> Dict[str, Any]:
    """One mpirun of two ranks on `cpus` (rank 0 measures, rank 1 produces or
    echoes): ``{"stream": [{"bytes", "messages", "seconds"}], "round_trip":
    [{"bytes", "times_s"}]}``."""
    spec = json.dumps({"cpus": list(cpus), "stream": [list(s) for s in streams],
                       "round_trip": [list(r) for r in round_trips], "lifetime_s": int(timeout_s) + 5})

    def command(scratch: str) -> List[str]:
        # each rank pins itself (the worker), so mpirun binds nothing
        yields = ["--mca", "mpi_yield_when_idle", "1"] if placement == "same" else []
        return mpirun_command(2, False, scratch) + yields + [sys.executable, "-m", "shmrdv.bench._mpi_p2p_worker", spec]

    return launch_mpi(command, timeout_s, _MARK)  # type: ignore[no-any-return]
