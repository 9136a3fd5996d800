"""Bridges as real processes (``python -m shmrdv bridge``), optionally inside
a network namespace, and two namespaces joined by a veth pair as two hosts."""
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from typing import List, Optional

import pytest

START_TIMEOUT_S = 20.0


class BridgeProc:
    """One bridge process serving rendezvous ``name``."""

    def __init__(self, name: str, listen: str = "127.0.0.1:0", *, token_file: Optional[str] = None,
                 size: Optional[int] = None, netns: Optional[str] = None, extra: List[str] = (), log_path: Optional[str] = None,
                 max_files: Optional[int] = None) -> None:
        self.name, self.listen, self.token_file, self.size = name, listen, token_file, size
        self.netns, self.extra, self.log_path = netns, list(extra), log_path
        self.max_files = max_files  # its RLIMIT_NOFILE, soft and hard (ulimit -n)
        self.proc: Optional[subprocess.Popen] = None
        self.host, self.port = None, None

    def command(self) -> List[str]:
        cmd = [sys.executable, "-m", "shmrdv", "bridge", "--name", self.name, "--listen", self.listen]
        if self.token_file:
            cmd += ["--token-file", self.token_file]
        if self.size:
            cmd += ["--size", str(self.size)]
        cmd += self.extra
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        return cmd

    def start(self) -> "BridgeProc":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        limit = None if self.max_files is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_files,) * 2))
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log, preexec_fn=limit)
        if self.log_path:
            log.close()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                self.kill()
                raise RuntimeError(f"bridge {self.name} did not start: {self.logs()}")
            chunk = os.read(self.proc.stdout.fileno(), 256)
            if not chunk:
                self.proc.wait(5)
                raise RuntimeError(f"bridge {self.name} exited with {self.proc.returncode}: {self.logs()}")
            line += chunk
        sel.close()
        text = line.decode().strip()
        assert text.startswith("listening "), text
        host, _, port = text.split(" ", 1)[1].rpartition(":")
        self.host, self.port = host, int(port)
        # Later listens reuse the same port (a restarted bridge keeps its address).
        self.listen = f"{self.listen.rpartition(':')[0]}:{self.port}"
        return self

    def logs(self) -> str:
        if self.log_path and os.path.exists(self.log_path):
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        return "(no log)"

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"bridge {self.name} ignored SIGTERM: {self.logs()}")
        self._close()
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def write_token(path, token: str) -> str:
    path.write_text(f"  {token}\n")
    os.chmod(path, 0o600)
    return str(path)


class TwoHosts:
    """Network namespaces A and B joined by a veth pair: 10.R.0.1 and 10.R.0.2."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.ns = (f"srdv-a-{tag}", f"srdv-b-{tag}")
        self.dev = (f"va{tag}", f"vb{tag}")
        octet = 200 + secrets.randbelow(50)
        self.ip = (f"10.{octet}.0.1", f"10.{octet}.0.2")

    def up(self) -> None:
        ip = ["ip"]
        self._run(ip + ["netns", "add", self.ns[0]])
        self._run(ip + ["netns", "add", self.ns[1]])
        self._run(ip + ["link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1]])
        for i in (0, 1):
            self._run(ip + ["link", "set", self.dev[i], "netns", self.ns[i]])
            self._run(ip + ["-n", self.ns[i], "addr", "add", f"{self.ip[i]}/24", "dev", self.dev[i]])
            self._run(ip + ["-n", self.ns[i], "link", "set", self.dev[i], "up"])
            self._run(ip + ["-n", self.ns[i], "link", "set", "lo", "up"])

    def down(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    @staticmethod
    def _run(cmd: List[str]) -> None:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def two_hosts_or_skip() -> TwoHosts:
    if os.geteuid() != 0:
        pytest.skip("two-host tests create network namespaces, which needs root")
    if shutil.which("ip") is None:
        pytest.skip("two-host tests need the 'ip' command (iproute2)")
    hosts = TwoHosts()
    try:
        hosts.up()
    except (subprocess.CalledProcessError, OSError) as exc:
        hosts.down()
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot create network namespaces here: {exc} {detail.decode(errors='replace').strip()}")
    return hosts


def run_threads(threads, timeout: float = 120.0) -> None:
    """Start the threads and join them all; fail if any is still running."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout} s: {stuck}"
