"""Every fenced code block of README.md and of the documentation site (docs/**/*.md) runs as
written, or says why it cannot.

Each block is extracted (```python, ```sh/```bash/```shell, ```console, plain
``` and any other info string) and run in a temporary directory: Python blocks
as a script (``python block.py``), shell blocks with ``bash -e``, console
blocks as the commands on their ``$ `` lines. A block that is not Python or
shell, or cannot run in a test, must say so in an HTML comment on the line
right before its fence (invisible on GitHub; the site's build drops it, see
docs/hooks.py)::

    <!-- readme-test: ITEM; ITEM; ... -->

with these items:

``skip=REASON``
    not run; the reason (required) is the test's skip message. It takes the
    rest of the comment, so it comes last.
``group=NAME``
    the blocks of one group (of one file) run together, as one test: first the
    ``background`` ones, each until it listens on the loopback ports of its
    ``--listen`` options, then all the others at the same time.
``background``
    (in a group) left running while the others run, then stopped as Ctrl-C
    would (SIGINT to its process group); it must exit by itself, tidying up.
``expect=TEXT``
    its standard output must contain TEXT.
``needs=MODULE[,MODULE]``
    skipped when one of these Python modules is not installed.

A block whose info string is ``text`` is a drawing or a program's output, not a
program: it is not run and needs no marker.

A block with neither a runnable language nor ``skip`` fails
``test_every_block_runs_or_says_why``, so a new block cannot slip in
untested. Blocks must exit 0; Python blocks must also print nothing on
stderr (no warnings). Every process a block starts is killed at the end.

Isolation: each rendezvous or group name the blocks use (``Rendezvous("NAME"``, ``Group("NAME"`` and
``--name NAME``) is replaced by ``NAME-<session tag>``, and each loopback port
(``127.0.0.1:PORT``) by a free one, so that runs on the same machine do not
meet. The blocks must remove what they create: a segment of this run (or a private
one, ``shmrdv-private-PID-*``, of a block's process) left in /dev/shm after a
block fails it (and is removed).

``test_the_readme_and_the_docs_run_in_a_container_sized_dev_shm`` (slow) runs
them all again where /dev/shm is a container's default 64 MiB.
"""
import importlib.util
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from ..conftest import SESSION_PREFIX, SHM_DIR, run_with_private_shm

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]

BLOCK_TIMEOUT_S = 120.0    # the foreground blocks of one test, all together
READY_TIMEOUT_S = 30.0     # a background block until it listens
STOP_TIMEOUT_S = 30.0      # a background block after SIGINT (bridges drain for up to 10 s)

LANGUAGES = {"python": "python", "py": "python", "python3": "python",
             "sh": "shell", "bash": "shell", "shell": "shell", "console": "console"}
FIGURES = {"text"}  # drawings and output: never run
FLAGS = {"background"}
VALUED = {"skip", "group", "expect", "needs"}

TAG = f"{SESSION_PREFIX}{uuid.uuid4().hex[:6]}"

MARKER = re.compile(r"^\s*<!--\s*readme-test:(?P<body>.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass
class Block:
    source: str                    # the file, relative to the repository root
    line: int                      # of the opening fence, 1-based
    lang: str                      # the info string's first word, lowercased ("" for plain ```)
    code: str
    options: Dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> Optional[str]:
        return LANGUAGES.get(self.lang)

    @property
    def label(self) -> str:
        return f"{self.source}:{self.line} ({self.lang or 'plain'})"


def parse_options(body: str) -> Tuple[Dict[str, str], List[str]]:
    options: Dict[str, str] = {}
    problems: List[str] = []
    rest = body.strip()
    while rest:
        item, sep, tail = rest.partition(";")
        key, eq, value = item.partition("=")
        key = key.strip()
        if key == "skip":  # the reason is the rest of the comment, semicolons and all
            value = (value + sep + tail) if eq else ""
            tail = ""
        value = value.strip()
        if key in FLAGS:
            if eq:
                problems.append(f"'{key}' takes no value")
            options[key] = ""
        elif key in VALUED:
            if not value:
                problems.append(f"'{key}' needs a value ({key}=...)")
            options[key] = value
        else:
            problems.append(f"unknown item {key!r} (known: {sorted(FLAGS | VALUED)})")
        rest = tail.strip()
    return options, problems


def parse_markdown(text: str, source: str = "README.md") -> Tuple[List[Block], List[str]]:
    """The fenced blocks of a Markdown text (the file ``source``) with their markers, and what is
    wrong with them."""
    lines = text.splitlines()
    blocks: List[Block] = []
    problems: List[str] = []
    marker: Optional[Tuple[int, Dict[str, str]]] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            if marker is not None:
                problems.append(f"{source}:{marker[0]}: marker not right before a code block")
            options, bad = parse_options(m.group("body"))
            problems += [f"{source}:{i + 1}: {p}" for p in bad]
            marker = (i + 1, options)
            i += 1
            continue
        if "readme-test" in line:
            problems.append(f"{source}:{i + 1}: malformed marker, want <!-- readme-test: ITEM; ... --> on one line")
        f = FENCE.match(line)
        if f:
            indent, fence, info = f.group("indent"), f.group("fence"), f.group("info").strip()
            close = re.compile(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
            body: List[str] = []
            j = i + 1
            while j < len(lines) and not close.match(lines[j]):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            if j == len(lines):
                problems.append(f"{source}:{i + 1}: code block never closed")
            lang = info.split()[0].lower() if info else ""
            blocks.append(Block(source, i + 1, lang, "\n".join(body) + "\n", marker[1] if marker else {}))
            marker = None
            i = j + 1
            continue
        if line.strip() and marker is not None:
            problems.append(f"{source}:{marker[0]}: marker not right before a code block")
            marker = None
        i += 1
    if marker is not None:
        problems.append(f"{source}:{marker[0]}: marker not right before a code block")
    for b in blocks:
        if "skip" in b.options or b.lang in FIGURES:
            continue
        if b.kind is None:
            problems.append(f"{b.label}: neither runnable (python, sh, bash, console) nor marked "
                            f"<!-- readme-test: skip=REASON -->")
        if "background" in b.options and "group" not in b.options:
            problems.append(f"{b.label}: 'background' only makes sense in a group")
    return blocks, problems


@dataclass
class Unit:
    """What one test runs: a block, or the blocks of a group."""
    id: str
    blocks: List[Block]
    skip: Optional[str] = None


def units_of(blocks: List[Block]) -> List[Unit]:
    units: List[Unit] = []
    groups: Dict[Tuple[str, str], Unit] = {}
    for b in blocks:
        if "skip" in b.options:
            units.append(Unit(f"{b.source}:{b.line}-skipped", [b], b.options["skip"]))
        elif b.kind is None:
            continue  # a figure, or reported by test_every_block_runs_or_says_why
        elif "group" in b.options:
            name = (b.source, b.options["group"])
            if name not in groups:
                groups[name] = Unit(f"{b.source}:{b.line}-{name[1]}", [])
                units.append(groups[name])
            groups[name].blocks.append(b)
        else:
            units.append(Unit(f"{b.source}:{b.line}-{b.lang}", [b]))
    return units


def _parse_documents() -> Tuple[List[Block], List[str]]:
    blocks: List[Block] = []
    problems: List[str] = []
    for path in DOCUMENTS:
        found, wrong = parse_markdown(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
        blocks += found
        problems += wrong
    return blocks, problems


BLOCKS, PROBLEMS = _parse_documents()
UNITS = units_of(BLOCKS)


# -- isolation: unique names, free ports ---------------------------------------------------------

NAME_PATTERNS = [re.compile(r"""(?:Rendezvous|Group)\(\s*["']([^"']+)["']"""), re.compile(r"--name[= ]+([^\s'\"]+)")]
PORT_PATTERN = re.compile(r"127\.0\.0\.1:(\d+)")


def _free_port(taken) -> int:
    """A loopback port free now, below the ephemeral range, so that nobody's bind to port 0 takes
    it before the block does."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found")


def _substitutions() -> Tuple[Dict[str, str], Dict[str, int]]:
    names: Dict[str, str] = {}
    ports: Dict[str, int] = {}
    for b in BLOCKS:
        if b.kind is None or "skip" in b.options:
            continue
        for pattern in NAME_PATTERNS:
            for name in pattern.findall(b.code):
                names[name] = f"{name}-{TAG}"
        for port in PORT_PATTERN.findall(b.code):
            if port != "0" and port not in ports:
                ports[port] = _free_port(set(ports.values()))
    return names, ports


NAMES, PORTS = _substitutions()


def isolated(code: str) -> str:
    for name, unique in NAMES.items():
        code = re.sub(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])", unique, code)
    return PORT_PATTERN.sub(lambda m: f"127.0.0.1:{PORTS.get(m.group(1), m.group(1))}", code)


def our_segments(pids=()) -> List[str]:
    """This run's named segments, and the private ones (``Rendezvous()``) the given processes made."""
    private = tuple(f"shmrdv-private-{pid}-" for pid in pids)
    return sorted(e for e in os.listdir(SHM_DIR) if TAG in e or (private and e.startswith(private)))


# -- running --------------------------------------------------------------------------------------

# Children start with SIGINT at its default, even under a parent that ignores it
# (a background job of a non-interactive shell), so that "Ctrl-C" reaches them.
_RESET_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"


def _group_members(pgid: int) -> List[int]:
    """Live (non-zombie) processes of a process group."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def _listening(port: int) -> bool:
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[1].endswith(want) and cols[3] == "0A":  # local address, state LISTEN
                return True
    return False


class Run:
    """One block started as its own process group, its output in files."""

    def __init__(self, block: Block, workdir: Path, n: int) -> None:
        self.block = block
        self.code = isolated(block.code)
        if block.kind == "console":
            self.code = "".join(line[2:] + "\n" for line in self.code.splitlines() if line.startswith("$ "))
        suffix = ".py" if block.kind == "python" else ".sh"
        self.script = workdir / f"block{n}-line{block.line}{suffix}"
        self.script.write_text(self.code)
        self.out_path, self.err_path = workdir / f"block{n}.out", workdir / f"block{n}.err"
        argv = [sys.executable, str(self.script)] if block.kind == "python" else ["bash", "-e", str(self.script)]
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", _RESET_SIGINT, *argv], cwd=workdir, env=env,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)

    def output(self) -> Tuple[str, str]:
        return (self.out_path.read_text(errors="replace"), self.err_path.read_text(errors="replace"))

    def describe(self) -> str:
        out, err = self.output()
        return (f"{self.block.label}, exit code {self.proc.returncode}\n--- as run:\n{self.code}"
                f"--- stdout:\n{out[-4000:]}\n--- stderr:\n{err[-4000:]}")

    def kill(self) -> None:
        """SIGKILL whatever is left of its process group."""
        for _ in range(50):
            members = _group_members(self.proc.pid)
            if not members:
                break
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if self.proc.poll() is None:
                try:
                    self.proc.wait(1)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _wait_ready(run: Run) -> None:
    ports = [int(p) for p in re.findall(r"--listen[= ]+127\.0\.0\.1:(\d+)", run.code)]
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(_listening(p) for p in ports):
        if run.proc.poll() is not None:
            pytest.fail(f"background block exited before it listened on {ports}:\n{run.describe()}")
        if time.monotonic() > deadline:
            pytest.fail(f"background block not listening on {ports} after {READY_TIMEOUT_S} s:\n{run.describe()}")
        time.sleep(0.05)


def _stop(run: Run) -> None:
    """Ctrl-C: SIGINT to its process group; then it must be gone within STOP_TIMEOUT_S."""
    try:
        os.killpg(run.proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _group_members(run.proc.pid) or run.proc.poll() is None:
        if time.monotonic() > deadline:
            pytest.fail(f"background block still running {STOP_TIMEOUT_S} s after SIGINT:\n{run.describe()}")
        time.sleep(0.05)


def _check(run: Run) -> None:
    out, err = run.output()
    assert run.proc.returncode == 0, run.describe()
    if run.block.kind == "python":
        assert not err.strip(), f"a documented program printed on stderr:\n{run.describe()}"
    want = run.block.options.get("expect")
    if want is not None:
        assert want in out, f"stdout lacks {want!r}:\n{run.describe()}"


def _run_unit(unit: Unit, workdir: Path) -> None:
    for b in unit.blocks:
        for module in filter(None, (m.strip() for m in b.options.get("needs", "").split(","))):
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"{b.label} needs {module}, which is not installed")
    background = [b for b in unit.blocks if "background" in b.options]
    foreground = [b for b in unit.blocks if "background" not in b.options]
    runs: List[Run] = []
    try:
        for b in background:
            runs.append(Run(b, workdir, len(runs)))
            _wait_ready(runs[-1])
        started = [Run(b, workdir, len(runs) + i) for i, b in enumerate(foreground)]
        runs += started
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        for run in started:
            try:
                run.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                run.kill()
                pytest.fail(f"still running after {BLOCK_TIMEOUT_S} s, killed:\n{run.describe()}")
        for run in started:
            _check(run)
        for run in runs[:len(background)]:
            _stop(run)
            out, err = run.output()
            assert "Traceback" not in out + err, run.describe()
    finally:
        for run in runs:
            run.kill()
        left = our_segments(run.proc.pid for run in runs)
        for entry in left:
            os.unlink(os.path.join(SHM_DIR, entry))
    assert not left, f"the blocks of {unit.id} left segments in {SHM_DIR}: {left}"


# -- the tests ------------------------------------------------------------------------------------

def test_every_block_runs_or_says_why():
    assert any(b.source == "README.md" for b in BLOCKS), "no code block found in README.md"
    assert any(b.source.startswith("docs/") for b in BLOCKS), "no code block found in docs/"
    assert not PROBLEMS, "code blocks:\n" + "\n".join(PROBLEMS) + "\n\n" + __doc__


@pytest.mark.timeout(300)
@pytest.mark.parametrize("unit", UNITS, ids=[u.id for u in UNITS])
def test_readme_block(unit, tmp_path):
    if unit.skip is not None:
        pytest.skip(f"{unit.blocks[0].source}:{unit.blocks[0].line}: {unit.skip}")
    _run_unit(unit, tmp_path)


def test_parser_understands_markers():
    text = "\n".join([
        "<!-- readme-test: skip=one; two -->",
        "```sh",
        "rm -rf /",
        "```",
        "",
        "<!-- readme-test: group=g; background -->",
        "  ```python",
        "  print(1)",
        "  ```",
        "```",
        "plain",
        "```",
        "<!-- readme-test: bogus -->",
        "text",
    ])
    blocks, problems = parse_markdown(text)
    assert [(b.line, b.lang, b.code) for b in blocks] == [(2, "sh", "rm -rf /\n"), (7, "python", "print(1)\n"),
                                                           (10, "", "plain\n")]
    assert blocks[0].options == {"skip": "one; two"}
    assert blocks[1].options == {"group": "g", "background": ""}
    assert any("README.md:10" in p and "neither runnable" in p for p in problems)
    assert any("unknown item 'bogus'" in p for p in problems)
    assert any("README.md:13: marker not right before a code block" in p for p in problems)
    assert len(problems) == 3


def test_parser_takes_text_blocks_as_figures_and_groups_per_file():
    figure, problems = parse_markdown("```text\n[ header ][ arena ]\n```\n", "docs/a.md")
    assert [(b.source, b.lang) for b in figure] == [("docs/a.md", "text")] and not problems
    assert units_of(figure) == []
    grouped = "<!-- readme-test: group=g -->\n```python\nprint(1)\n```\n"
    blocks = parse_markdown(grouped, "docs/a.md")[0] + parse_markdown(grouped, "docs/b.md")[0]
    assert [u.id for u in units_of(blocks)] == ["docs/a.md:2-g", "docs/b.md:2-g"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_and_the_docs_run_in_a_container_sized_dev_shm():
    """Every block, as test_readme_block runs it, in a mount namespace with a
    fresh 64 MiB tmpfs on /dev/shm: what Docker and Kubernetes give a
    container by default (needs root and unshare(1); else skipped, saying
    why). The examples must work there as written."""
    run = run_with_private_shm([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                                f"{Path(__file__).relative_to(ROOT)}::test_readme_block"], timeout=840, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    assert " passed" in run.stdout and "error" not in run.stdout, run.stdout[-4000:]
