"""Run a command and report the peak memory of its process tree and of its shared memory.

    python benchmarks/peak_memory.py [--interval S] [--json FILE] -- COMMAND...

e.g. ``python benchmarks/peak_memory.py -- python -m pytest benchmarks --benchmark-enable --benchmark-only``.

Every ``--interval`` seconds (default 0.2) it sums, over the command and all
its descendants (found in /proc):

- ``rss``: RssAnon + RssFile of every process (their private memory and the
  files they map; shared libraries count once per process, so this errs high)
  plus the bytes allocated to the run's segments in /dev/shm
  (``shmrdv-bench-<pid>-*`` of any process of the tree: shmrdv's and the
  hand-rolled ring's), each shared page once. This is the figure to compare
  with the machine's memory.
- ``pss``: the proportional set size of every process (smaps_rollup), where
  a page mapped by n processes counts 1/n in each: mapped shared memory
  counts once.
- ``shm_used``: what ``df /dev/shm`` calls used, machine-wide (other users'
  segments too), and ``mem_used``: MemTotal - MemAvailable, machine-wide.

It prints the peak of each (and when it happened, with the command's last
output line then), and the command's exit code is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shmrdv.bench.cleanup import descendants  # noqa: E402

_SEGMENT = re.compile(r"shmrdv-bench-(\d+)-")
GiB = 1 << 30


def _status_kib(pid: int, fields: tuple) -> Dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in fields:
                    out[name] = int(value.split()[0])
    except OSError:
        pass
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _meminfo_kib() -> Dict[str, int]:
    out = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, value = line.partition(":")
            out[name] = int(value.split()[0])
    return out


def sample(root: int) -> Dict[str, int]:
    """One sample, in bytes."""
    tree = [root, *descendants(root)]
    rss = pss = 0
    for pid in tree:
        fields = _status_kib(pid, ("RssAnon", "RssFile"))
        rss += 1024 * (fields.get("RssAnon", 0) + fields.get("RssFile", 0))
        pss += 1024 * _pss_kib(pid)
    pids = set(tree)
    segments = 0
    try:
        entries = list(os.scandir("/dev/shm"))
    except OSError:
        entries = []
    for entry in entries:
        match = _SEGMENT.match(entry.name)
        if match and int(match.group(1)) in pids:
            try:
                segments += entry.stat().st_blocks * 512
            except OSError:
                pass
    vfs = os.statvfs("/dev/shm")
    mem = _meminfo_kib()
    return {"rss": rss + segments, "process_rss": rss, "segments": segments, "pss": pss,
            "shm_used": (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
            "mem_used": 1024 * (mem["MemTotal"] - mem["MemAvailable"]), "processes": len(tree)}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--json", help="write the peaks (and every sample) here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    before = sample(os.getpid())
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    last_line = [""]

    def relay() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if line.strip():
                last_line[0] = line.strip()[:160]

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    start = time.monotonic()
    peaks: Dict[str, Dict] = {}
    samples = []
    while proc.poll() is None:
        now = sample(proc.pid)
        now["t"] = round(time.monotonic() - start, 2)
        samples.append(now)
        for name, value in now.items():
            if name != "t" and (name not in peaks or value > peaks[name]["value"]):
                peaks[name] = {"value": value, "t": now["t"], "after": last_line[0]}
        time.sleep(args.interval)
    reader.join(5)
    elapsed = time.monotonic() - start
    print(f"\n--- peak memory of {' '.join(command)} ({elapsed:.0f} s, {len(samples)} samples "
          f"every {args.interval} s)", file=sys.stderr)
    for name in ("rss", "process_rss", "segments", "pss", "shm_used", "mem_used"):
        peak = peaks.get(name)
        if peak is None:
            continue
        base = f" (before: {before[name] / GiB:.2f} GiB)" if name in ("shm_used", "mem_used") else ""
        print(f"{name:>12}: {peak['value'] / GiB:6.2f} GiB at {peak['t']:7.1f} s{base}, after the line: {peak['after']}",
              file=sys.stderr)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": command, "exit_code": proc.returncode, "seconds": elapsed, "before": before,
                       "peaks": peaks, "samples": samples}, out)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
