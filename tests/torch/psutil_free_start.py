"""START: when this process started (seconds since the epoch), from /proc, so the DDP script can
report the time from its start, not from its first import."""
import os
import time

with open(f"/proc/{os.getpid()}/stat") as _stat:
    _ticks = int(_stat.read().rsplit(")", 1)[1].split()[19])
with open("/proc/stat") as _boot:
    _btime = next(int(line.split()[1]) for line in _boot if line.startswith("btime"))
START = _btime + _ticks / os.sysconf("SC_CLK_TCK")
