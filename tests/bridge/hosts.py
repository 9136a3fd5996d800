"""Simulated hosts: N on one machine, each with a network, a /dev/shm and a
hostname of its own and its own ``shmrdv bridge``, on one L2 segment whose
links can be slowed, made lossy, cut and flapped.

Host i (``Network.hosts[i]``) is three namespaces:

* a network namespace whose ``eth0`` (10.43.0.<i+1>/24) is one end of a
  veth pair; the other end is a port of the Linux bridge device ``sw``, in
  a switch namespace of its own. The hosts share one L2 segment and nothing
  of this machine's own network.
* a mount namespace with a private tmpfs on /dev/shm: the host's segments
  are its own, so every host serves the same rendezvous name, as separate
  machines would.
* a UTS namespace whose hostname is ``h<i>``.

The mount and UTS namespaces are kept by bind mounts (``unshare
--mount=FILE``), so every process of a host joins the same ones:
``Host.enter()`` is the ``nsenter`` prefix that runs a command on it.

Between hosts: ``impair()`` puts tc netem (delay, jitter, loss) on every
host's egress; ``partition(i)`` takes host i's switch port down (nothing in
or out, as a pulled cable) until ``heal(i)``; ``flap(i, s)`` does both.
Needs root, iproute2, util-linux's unshare and nsenter, and for
``impair()`` the kernel's sch_netem; tests skip, saying which is missing.

Leftovers of a run that was killed before it could clean up (namespaces,
bind mounts, bridge processes) are removed by the next run.
"""
import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Sequence

import pytest

from .bridges import BridgeProc, LineReader, netns_or_skip, run_root, up_or_skip, write_token

SUBNET = "10.43.0"
BRIDGE_PORT = 7700
RDV_NAME = "host"  # the same on every host: each has its own /dev/shm
TOKEN = "simulated hosts share this token"
STATE_DIR = Path("/run/shmrdv-hosts")  # per network: the files that keep each host's mount and UTS namespaces
SHM_SIZE = "256m"
TRAFFIC = Path(__file__).with_name("host_traffic.py")
_TAG = re.compile(r"^(\d+)x[0-9a-f]{2}$")  # a network's tag: the pid that made it, and a random byte


def _quiet(cmd: List[str]) -> None:
    """A teardown step: whatever it says, the next one still runs."""
    subprocess.run(cmd, capture_output=True, timeout=30)


class Host:
    """One simulated host: its namespaces, its address, its bridge."""

    def __init__(self, net: "Network", index: int) -> None:
        self.index = index
        self.hostname = f"h{index}"
        self.netns = f"shmrdv-{net.tag}-h{index}"
        self.ip = f"{SUBNET}.{index + 1}"
        self.port = f"p{net.tag}-{index}"  # its port on the switch
        self.url = f"tcp://{self.ip}:{BRIDGE_PORT}"
        self.job = f"/job:h{index}"
        self.mnt = net.state / f"h{index}.mnt"
        self.uts = net.state / f"h{index}.uts"
        self.bridge: Optional[BridgeProc] = None

    def enter(self) -> List[str]:
        """The command prefix that runs a program on this host."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", f"--mount={self.mnt}", f"--uts={self.uts}", "--"]

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return run_root(self.enter() + list(argv))


class HostProcess:
    """A program running on a host, talking in lines on stdin and stdout."""

    def __init__(self, host: Host, argv: Sequence[str], log_path: str) -> None:
        self.host, self.log_path = host, log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(host.enter() + list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)
        self._lines = LineReader(self.proc.stdout)
        self.said: List[str] = []  # every line so far

    def expect(self, word: str, timeout: float) -> str:
        """The line starting with word: one said already, or the next, which
        must come within timeout seconds."""
        for line in self.said:
            if line.startswith(word):
                return line
        try:
            line = self._lines.line(timeout)
        except EOFError:
            line = None
        if line is None or not line.startswith(word):
            raise AssertionError(f"{self.host.hostname}: expected {word!r} within {timeout:.0f} s, got {line!r}; "
                                 f"its log: {self.log()}")
        self.said.append(line)
        return line

    def tell(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-3000:] or "(empty)"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._lines.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()


class Network:
    """N simulated hosts on one switch; ``up()``, then ``down()`` in a finally."""

    def __init__(self, n: int, tmp_path: Path) -> None:
        assert 1 <= n <= 200
        self.tag = f"{os.getpid()}x{secrets.token_hex(1)}"
        self.state = STATE_DIR / self.tag
        self.switch = f"shmrdv-{self.tag}-sw"
        self.tmp = tmp_path
        self.token_file = write_token(tmp_path / "token", TOKEN)
        self.hosts = [Host(self, i) for i in range(n)]
        self.processes: List[HostProcess] = []
        self.netem: Optional[str] = None

    # ---- making and unmaking ---------------------------------------------------

    def up(self) -> "Network":
        remove_leftovers()
        self.state.mkdir(parents=True)
        # unshare --mount=FILE wants FILE on a mount that does not propagate
        run_root(["mount", "--bind", str(self.state), str(self.state)])
        run_root(["mount", "--make-private", str(self.state)])
        run_root(["ip", "netns", "add", self.switch])
        run_root(["ip", "-n", self.switch, "link", "add", "sw", "type", "bridge"])
        run_root(["ip", "-n", self.switch, "link", "set", "sw", "up"])
        for h in self.hosts:
            run_root(["ip", "netns", "add", h.netns])
            run_root(["ip", "link", "add", h.port, "netns", self.switch, "type", "veth", "peer", "name", "eth0",
                      "netns", h.netns])
            run_root(["ip", "-n", self.switch, "link", "set", h.port, "master", "sw", "up"])
            run_root(["ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0"])
            run_root(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
            run_root(["ip", "-n", h.netns, "link", "set", "lo", "up"])
            for path in (h.mnt, h.uts):
                path.touch()
            run_root(["unshare", f"--mount={h.mnt}", f"--uts={h.uts}", "--propagation", "private", "sh", "-c",
                      f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 shmrdv-{h.hostname} /dev/shm && "
                      f"hostname {h.hostname}"])
        return self

    def down(self) -> None:
        """Stop every process, remove every namespace and mount (and with the
        mount namespaces, each host's /dev/shm). Runs every step whatever
        the others did."""
        try:
            for p in self.processes:
                p.kill()
            for h in self.hosts:
                if h.bridge is not None:
                    h.bridge.kill()
        finally:
            _remove(self.tag)  # kills whatever still runs in the namespaces, too

    # ---- bridges and programs ----------------------------------------------------

    def start_bridge(self, i: int, routes: Optional[Sequence[int]] = None, extra: Sequence[str] = ()) -> BridgeProc:
        """Host i's bridge, serving rendezvous RDV_NAME (created, 64 MiB) on
        its address, told about the routes to the hosts in routes (default
        every other). A restart keeps the command line."""
        h = self.hosts[i]
        routes = [j for j in range(len(self.hosts)) if j != i] if routes is None else routes
        args = [arg for j in routes for arg in ("--route", f"{self.hosts[j].job}={self.hosts[j].url}")]
        h.bridge = BridgeProc(RDV_NAME, f"{h.ip}:{BRIDGE_PORT}", token_file=self.token_file, size=64 << 20,
                              enter=h.enter(), extra=args + list(extra), log_path=str(self.tmp / f"bridge-{h.hostname}.log"))
        return h.bridge.start()

    def restart_bridge(self, i: int) -> None:
        """kill -9 host i's bridge and start it again, on the same address."""
        bridge = self.hosts[i].bridge
        assert bridge is not None
        bridge.kill()
        bridge.start()

    def traffic(self, i: int, send_to: Sequence[int], recv_from: Sequence[int], **settings: Any) -> HostProcess:
        """tests/bridge/host_traffic.py on host i: streams to the hosts in send_to,
        checked streams from those in recv_from (settings: see its Traffic)."""
        h = self.hosts[i]
        cfg = {"me": i, "name": RDV_NAME, "token": TOKEN, "send_to": list(send_to), "recv_from": list(recv_from),
               "routes": {self.hosts[j].job: self.hosts[j].url for j in send_to},
               "keys": 2, "seconds": 10.0, "max_messages": 100_000, "pause": 0.0,
               "send_timeout": 120.0, "recv_timeout": 90.0, "drain_timeout": 60.0}
        cfg.update(settings)
        p = HostProcess(h, [sys.executable, str(TRAFFIC), json.dumps(cfg)], str(self.tmp / f"traffic-{h.hostname}.log"))
        self.processes.append(p)
        return p

    # ---- the links ------------------------------------------------------------

    def impair(self, delay_ms: float = 1.0, jitter_ms: float = 0.5, loss_pct: float = 1.0) -> None:
        """netem on every host's egress: each packet between two hosts is
        delayed delay ± jitter and lost with loss_pct % chance (skips the
        test where the kernel has no sch_netem)."""
        spec = ["delay", f"{delay_ms}ms", f"{jitter_ms}ms", "loss", f"{loss_pct}%"]
        for h in self.hosts:
            try:
                run_root(["tc", "-n", h.netns, "qdisc", "replace", "dev", "eth0", "root", "netem"] + spec)
            except subprocess.CalledProcessError as exc:
                why = exc.stderr.decode(errors="replace").strip()
                if "unknown" in why.lower() or "no such file" in why.lower():
                    pytest.skip(f"tc netem is not available here ({why}): this kernel was built without sch_netem "
                                "(CONFIG_NET_SCH_NETEM); load it with 'modprobe sch_netem' or use a kernel that has it")
                raise
        self.netem = " ".join(spec)

    def clear_impairment(self) -> None:
        for h in self.hosts:
            _quiet(["tc", "-n", h.netns, "qdisc", "del", "dev", "eth0", "root"])
        self.netem = None

    def partition(self, i: int) -> None:
        """Cut host i off: its switch port down, nothing in or out."""
        run_root(["ip", "-n", self.switch, "link", "set", self.hosts[i].port, "down"])

    def heal(self, i: int) -> None:
        run_root(["ip", "-n", self.switch, "link", "set", self.hosts[i].port, "up"])

    def flap(self, i: int, seconds: float) -> None:
        self.partition(i)
        try:
            time.sleep(seconds)
        finally:
            self.heal(i)


def network_or_skip(n: int, tmp_path: Path) -> Network:
    """A Network of n hosts, up; skips, saying why, where this machine cannot make one."""
    netns_or_skip("simulated-host tests", ("ip", "tc", "unshare", "nsenter", "mount"))
    return up_or_skip(Network(n, tmp_path), "make simulated hosts")


# ---- cleaning up ---------------------------------------------------------------------


def _remove(tag: str) -> None:
    """Everything of the network tagged tag: the processes in its namespaces,
    the namespaces (the veths and the switch go with them), the mounts."""
    prefix = f"shmrdv-{tag}-"
    try:
        names = [n for n in os.listdir("/run/netns") if n.startswith(prefix)]
    except FileNotFoundError:
        names = []
    for ns in names:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        _quiet(["ip", "netns", "del", ns])
    state = STATE_DIR / tag
    if state.exists():
        for path in sorted(state.iterdir()):
            _quiet(["umount", str(path)])  # the last reference to that namespace: its /dev/shm goes with it
        _quiet(["umount", str(state)])
        for path in state.iterdir():
            path.unlink()
        state.rmdir()
    try:
        STATE_DIR.rmdir()
    except OSError:
        pass  # absent, or another network's state is in it


def remove_leftovers() -> None:
    """Remove the networks of runs whose process is gone (killed before their teardown)."""
    tags = set()
    if STATE_DIR.exists():
        tags.update(p.name for p in STATE_DIR.iterdir())
    if os.path.isdir("/run/netns"):
        tags.update(n.split("-")[1] for n in os.listdir("/run/netns") if n.startswith("shmrdv-") and n.count("-") >= 2)
    for tag in tags:
        m = _TAG.match(tag)
        if m is None:
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            _remove(tag)
