"""What a benchmark run names of the machine it ran on: CPU, caches,
memory, kernel and the versions of everything measured."""
from __future__ import annotations
import contextlib
import importlib.metadata
import os
import platform
from typing import Any, Dict

import numpy as np

from . import mpi_p2p
from .common import MiB
from .processes import allowed_cpus


def machine() -> Dict[str, Any]:
    info: Dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "allowed_cpus": allowed_cpus(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    with contextlib.suppress(OSError):
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as l3:
            info["l3"] = l3.read().strip()
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as meminfo:
            info["memory_gib"] = round(int(meminfo.readline().split()[1]) / MiB, 1)
    import shmrdv

    info["shmrdv"] = shmrdv.__version__
    # versions from the installed metadata: importing torch (a second, and
    # its thread pools) into the measuring process would change what it measures
    for module, dist in (("zmq", "pyzmq"), ("torch", "torch"), ("mpi4py", "mpi4py"), ("faster_fifo", "faster-fifo")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info[module] = importlib.metadata.version(dist)
    open_mpi = mpi_p2p.version()
    if open_mpi:
        info["open_mpi"] = open_mpi
    return info
