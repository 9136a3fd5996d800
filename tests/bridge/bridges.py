"""Bridges as real processes (``python -m shmrdv bridge``), optionally inside
a network namespace, and two namespaces joined by a veth pair as two hosts
(tests/hosts.py makes N hosts with a /dev/shm of their own each)."""
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, List, Optional, Sequence

import pytest

START_TIMEOUT_S = 20.0


class LineReader:
    """Lines from a child's stdout, each awaited at most a given time."""

    def __init__(self, stream) -> None:
        self._fd = stream.fileno()
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._fd, selectors.EVENT_READ)

    def line(self, timeout: float) -> Optional[str]:
        """The next line, without its newline; None if none came within
        timeout seconds; EOFError if the child closed its stdout first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                return None
            chunk = os.read(self._fd, 4096)
            if not chunk:
                raise EOFError(f"stdout closed after {self._buf[-200:]!r}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def close(self) -> None:
        self._sel.close()


class BridgeProc:
    """One bridge process serving rendezvous ``name``; run inside network
    namespace ``netns``, or behind the command prefix ``enter`` (nsenter ...)."""

    def __init__(self, name: str, listen: str = "127.0.0.1:0", *, token_file: Optional[str] = None,
                 size: Optional[int] = None, netns: Optional[str] = None, extra: List[str] = (), log_path: Optional[str] = None,
                 max_files: Optional[int] = None, enter: Sequence[str] = ()) -> None:
        self.name, self.listen, self.token_file, self.size = name, listen, token_file, size
        self.enter = ["ip", "netns", "exec", netns] if netns else list(enter)
        self.extra, self.log_path = list(extra), log_path
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
        return self.enter + cmd

    def start(self) -> "BridgeProc":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        limit = None if self.max_files is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_files,) * 2))
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=log, preexec_fn=limit)
        if self.log_path:
            log.close()
        reader = LineReader(self.proc.stdout)
        try:
            text = reader.line(START_TIMEOUT_S)
        except EOFError:
            self.proc.wait(5)
            raise RuntimeError(f"bridge {self.name} exited with {self.proc.returncode}: {self.logs()}") from None
        finally:
            reader.close()
        if text is None:
            self.kill()
            raise RuntimeError(f"bridge {self.name} did not start: {self.logs()}")
        text = text.strip()
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
        run_root(ip + ["netns", "add", self.ns[0]])
        run_root(ip + ["netns", "add", self.ns[1]])
        run_root(ip + ["link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1]])
        for i in (0, 1):
            run_root(ip + ["link", "set", self.dev[i], "netns", self.ns[i]])
            run_root(ip + ["-n", self.ns[i], "addr", "add", f"{self.ip[i]}/24", "dev", self.dev[i]])
            run_root(ip + ["-n", self.ns[i], "link", "set", self.dev[i], "up"])
            run_root(ip + ["-n", self.ns[i], "link", "set", "lo", "up"])

    def down(self) -> None:
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def run_root(cmd: List[str]) -> subprocess.CompletedProcess:
    """Run one configuration command (ip, tc, mount, ...); CalledProcessError,
    with its stderr captured, if it fails."""
    return subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def netns_or_skip(what: str, tools: Sequence[str] = ("ip",)) -> None:
    """Skip, saying why, unless this process may create network namespaces
    (root) and has the tools (iproute2's ip, util-linux's nsenter, ...)."""
    if os.geteuid() != 0:
        pytest.skip(f"{what} create network namespaces, which needs root")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{what} need {', '.join(missing)} (iproute2, util-linux)")


def up_or_skip(hosts: Any, what: str) -> Any:
    """hosts.up(), or, where this machine cannot do it, hosts.down() and a skip saying why."""
    try:
        hosts.up()
    except (subprocess.CalledProcessError, OSError) as exc:
        hosts.down()
        detail = getattr(exc, "stderr", b"") or b""
        pytest.skip(f"cannot {what} here: {exc} {detail.decode(errors='replace').strip()}")
    return hosts


def two_hosts_or_skip() -> TwoHosts:
    netns_or_skip("two-host tests")
    return up_or_skip(TwoHosts(), "create network namespaces")


def run_threads(threads, timeout: float = 120.0) -> None:
    """Start the threads and join them all; fail if any is still running."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {timeout} s: {stuck}"
