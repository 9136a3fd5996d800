"""The C core's layers (docs/architecture.md), enforced.

LAYERS below is the one table of which layer each file of csrc/ belongs to
(a .c and its .h share a stem and a layer). The checks:

  - every csrc/*.c and *.h is in the table, and the table names no file
    that is gone;
  - includes go down: a file includes only headers of its own layer or
    lower, and a .c file includes a header of its own layer only if it is
    its own module's (rdv_arena.c may include rdv_arena.h, not rdv_index.h);
  - calls go strictly down: each .c is compiled and `nm` tells which
    functions it defines and which it uses; a use of a function defined in
    another file must name a lower layer. So no two C files depend on each
    other, directly or through others, within a layer either. A call upward
    has to go through a hook in struct rdv_ops (rdv_handle.h), which nm does
    not see and which rdv_open.c installs;
  - the top layer (rdv_api.c, rdv_inspect.c) defines only functions that
    shmrdv.h declares: it implements the public API and nothing else;
  - raw __atomic_ (and __sync_) builtins appear only in rdv_atomic.h;
  - a "Layer N" in a file's first comment agrees with the table.

The checkers take a csrc directory and return a list of violations, so the
self-tests at the end run them on a damaged copy of csrc/ to show that each
one fails when it should.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(20)

CSRC = Path(__file__).resolve().parent.parent.parent / "csrc"

# The one layer table: csrc file stem -> layer, lowest first.
LAYERS = {
    # L0: types only (shmrdv.h is the public API and the cffi cdef)
    "shmrdv": 0,
    "rdv_atomic": 0,
    "rdv_layout": 0,
    "rdv_handle": 0,
    # L1: OS calls; a spin's clock; the collectives' arithmetic (pure computation)
    "rdv_os": 1,
    "rdv_reduce": 1,
    "rdv_spin": 1,
    # L2: waits, segments, liveness
    "rdv_wait": 2,
    "rdv_segment": 2,
    "rdv_live": 2,
    # L3: lock words
    "rdv_lock": 3,
    # L4: key index, payload arena
    "rdv_index": 4,
    "rdv_arena": 4,
    # L5: waiter records and waiter queues
    "rdv_waiter": 5,
    # L6: per-key queues, hand-offs
    "rdv_queue": 6,
    # L7: leased receive recovery, producer marks
    "rdv_lease": 7,
    "rdv_mark": 7,
    # L8: reclaiming dead processes
    "rdv_recover": 8,
    # L9: create/attach/close, refs, the ops hooks
    "rdv_open": 9,
    # L10: the public entry points (implement shmrdv.h only)
    "rdv_api": 10,
    "rdv_inspect": 10,
    # collectives: a group's own segment, on the OS layer and the arithmetic alone
    "rdv_coll": 10,
}

ATOMIC_HEADER = "rdv_atomic.h"
RAW_ATOMIC = re.compile(r"\b__(?:atomic|sync)_\w*")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
LAYER_NOTE = re.compile(r"\bLayer (\d+)\b")


def source_files(csrc: Path) -> list:
    return sorted(p for p in csrc.iterdir() if p.suffix in (".c", ".h") and p.is_file())


def _strip_comments(text: str) -> str:
    # keep newlines so that line numbers stay right
    return COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def check_table(csrc: Path, layers: dict) -> list:
    """Files missing from the table, and table entries with no file."""
    stems = {p.stem for p in source_files(csrc)}
    problems = [f"{p.name} is not in the layer table (tests/c/test_layers.py LAYERS)"
                for p in source_files(csrc) if p.stem not in layers]
    problems += [f"the layer table names {stem!r} (layer {layer}), but csrc/ has no {stem}.c or {stem}.h"
                 for stem, layer in sorted(layers.items()) if stem not in stems]
    return problems


def check_includes(csrc: Path, layers: dict) -> list:
    """Every #include "..." in csrc must name a header of the same layer or lower; a .c may
    include a header of its own layer only if it is its own module's."""
    problems = []
    for path in source_files(csrc):
        if path.stem not in layers:
            continue  # reported by check_table
        mine = layers[path.stem]
        text = _strip_comments(path.read_text())
        for m in INCLUDE.finditer(text):
            name = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.name}:{line} (layer {mine}) includes {name!r}"
            target = csrc / name
            if Path(name).name != name or target.suffix != ".h" or not target.is_file():
                problems.append(f"{where}, which is not a header in csrc/")
                continue
            if target.stem not in layers:
                problems.append(f"{where}, which is not in the layer table")
                continue
            theirs = layers[target.stem]
            if theirs > mine:
                problems.append(f"{where} (layer {theirs}): an include of a higher layer")
            elif theirs == mine and path.suffix == ".c" and target.stem != path.stem:
                problems.append(
                    f"{where} (layer {theirs}): a .c file may include a header of its own layer "
                    f"only if it is its own ({path.stem}.h)")
    return problems


def check_atomics(csrc: Path) -> list:
    """Raw __atomic_/__sync_ builtins outside rdv_atomic.h."""
    problems = []
    for path in source_files(csrc):
        if path.name == ATOMIC_HEADER:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for m in RAW_ATOMIC.finditer(line):
                problems.append(f"{path.name}:{number} uses {m.group(0)} directly: "
                                f"use {ATOMIC_HEADER}'s macros")
    return problems


def check_layer_notes(csrc: Path, layers: dict) -> list:
    """A 'Layer N' in a file's first comment must agree with the table."""
    problems = []
    for path in source_files(csrc):
        first = COMMENT.search(path.read_text())
        note = LAYER_NOTE.search(first.group(0)) if first else None
        if note and path.stem in layers and int(note.group(1)) != layers[path.stem]:
            problems.append(f"{path.name}'s first comment says Layer {note.group(1)}, "
                            f"the layer table says {layers[path.stem]}")
    return problems


def tools_or_skip():
    gcc, nm = shutil.which("gcc"), shutil.which("nm")
    if gcc is None:
        pytest.skip("no gcc: the call check compiles each csrc/*.c to read its symbols")
    if nm is None:
        pytest.skip("no nm (binutils): the call check reads each object's symbols with it")
    return gcc, nm


def compile_objects(csrc: Path, out_dir: Path, gcc: str = "gcc") -> dict:
    """Compile every csrc/*.c on its own into out_dir: {stem: object path}."""
    sources = sorted(p for p in source_files(csrc) if p.suffix == ".c")
    run = subprocess.run([gcc, "-std=gnu11", "-O0", "-c", f"-I{csrc}", *map(str, sources)],
                         cwd=out_dir, capture_output=True, text=True, timeout=15)
    assert run.returncode == 0, f"gcc failed on {csrc}:\n{run.stderr}"
    return {p.stem: out_dir / f"{p.stem}.o" for p in sources}


def symbols(obj: Path, nm: str = "nm") -> tuple:
    """(defined global symbols, undefined symbols) of one object file."""
    run = subprocess.run([nm, "-P", str(obj)], capture_output=True, text=True, check=True, timeout=10)
    defined, undefined = set(), set()
    for line in run.stdout.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper():  # T (functions) and any global data (D, B, R, C, ...)
            defined.add(name)
    return defined, undefined


def check_calls(objects: dict, layers: dict, nm: str = "nm") -> list:
    """Every use of a symbol defined in another csrc file must go to a strictly lower layer."""
    problems = []
    table = {stem: symbols(obj, nm) for stem, obj in objects.items()}
    definer = {}
    for stem, (defined, _) in sorted(table.items()):
        for name in sorted(defined):
            if name in definer:
                problems.append(f"{name} is defined in both {definer[name]}.c and {stem}.c")
            definer.setdefault(name, stem)
    for caller, (_, undefined) in sorted(table.items()):
        for name in sorted(undefined):
            callee = definer.get(name)
            if callee is None or callee == caller or caller not in layers or callee not in layers:
                continue  # libc, or a file check_table reports
            if layers[callee] >= layers[caller]:
                kind = "the same layer" if layers[callee] == layers[caller] else "a higher layer"
                problems.append(
                    f"{caller}.c (layer {layers[caller]}) calls {name}, defined in {callee}.c "
                    f"(layer {layers[callee]}): a call into {kind}; calls must go to a strictly "
                    f"lower layer (or upward through an rdv_ops hook)")
    return problems


PUBLIC_HEADER = "shmrdv.h"
DECLARED = re.compile(r"\b(rdv_\w+)\s*\(")


def check_top_layer(csrc: Path, objects: dict, layers: dict, nm: str = "nm") -> list:
    """The top layer's files define only functions the public header declares."""
    top = max(layers.values())
    public = set(DECLARED.findall(_strip_comments((csrc / PUBLIC_HEADER).read_text())))
    problems = []
    for stem, obj in sorted(objects.items()):
        if layers.get(stem) != top:
            continue
        for name in sorted(symbols(obj, nm)[0] - public):
            problems.append(f"{stem}.c (layer {top}) defines {name}, which {PUBLIC_HEADER} does not "
                            f"declare: the top layer only implements the public API")
    return problems


def _report(problems: list) -> str:
    return "layering violations:\n  " + "\n  ".join(problems)


# ---- the checks on csrc/ ------------------------------------------------------


def test_layer_table_names_every_csrc_file():
    problems = check_table(CSRC, LAYERS)
    assert not problems, _report(problems)


def test_includes_go_down():
    problems = check_includes(CSRC, LAYERS)
    assert not problems, _report(problems)


@pytest.fixture(scope="module")
def csrc_objects(tmp_path_factory):
    gcc, nm = tools_or_skip()
    return compile_objects(CSRC, tmp_path_factory.mktemp("objects"), gcc), nm


def test_calls_go_strictly_down(csrc_objects):
    objects, nm = csrc_objects
    problems = check_calls(objects, LAYERS, nm)
    assert not problems, _report(problems)


def test_top_layer_implements_only_the_public_api(csrc_objects):
    objects, nm = csrc_objects
    problems = check_top_layer(CSRC, objects, LAYERS, nm)
    assert not problems, _report(problems)


def test_raw_atomics_only_in_rdv_atomic_h():
    problems = check_atomics(CSRC)
    assert not problems, _report(problems)


def test_layer_comments_agree_with_table():
    problems = check_layer_notes(CSRC, LAYERS)
    assert not problems, _report(problems)


# ---- the checkers fail when they should: run them on a damaged copy ----------------


@pytest.fixture
def scratch_csrc(tmp_path):
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    return copy


def _edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path.name}: update this self-test"
    path.write_text(text.replace(old, new))


def test_checker_reports_upward_and_sideways_includes(scratch_csrc):
    assert check_includes(scratch_csrc, LAYERS) == []
    _edit(scratch_csrc / "rdv_arena.c", '#include "rdv_arena.h"\n',
          '#include "rdv_arena.h"\n#include "rdv_recover.h"\n#include "rdv_index.h"\n')
    problems = check_includes(scratch_csrc, LAYERS)
    assert len(problems) == 2, problems
    upward, sideways = problems
    for text in ("rdv_arena.c", "(layer 4)", "rdv_recover.h", "(layer 8)", "higher layer"):
        assert text in upward, upward
    for text in ("rdv_arena.c", "rdv_index.h", "(layer 4)", "only if it is its own"):
        assert text in sideways, sideways


def test_checker_reports_upward_and_sideways_calls(scratch_csrc, tmp_path):
    gcc, nm = tools_or_skip()
    # Declared by hand, not included: the call check must catch it on its own.
    with open(scratch_csrc / "rdv_arena.c", "a") as f:
        f.write("\nint rdv_recover_dead(rdv_t *h, uint32_t *reclaimed);\n"
                "void rdv_arena_probe_upward(rdv_t *h) { rdv_recover_dead(h, 0); }\n")
    with open(scratch_csrc / "rdv_lease.c", "a") as f:
        f.write("\nint rdv_mark_get_impl(rdv_t *h, uint32_t idx, uint64_t *id, uint64_t *v0,"
                " uint64_t *v1);\n"
                "int rdv_lease_probe_sideways(rdv_t *h, uint64_t *x) {"
                " return rdv_mark_get_impl(h, 0, x, x, x); }\n")
    with open(scratch_csrc / "rdv_inspect.c", "a") as f:
        f.write("\nint rdv_inspect_probe_private(void) { return 0; }\n")
    objects_dir = tmp_path / "objects"
    objects_dir.mkdir()
    objects = compile_objects(scratch_csrc, objects_dir, gcc)
    problems = check_calls(objects, LAYERS, nm)
    assert len(problems) == 2, problems
    upward, sideways = problems
    for text in ("rdv_arena.c (layer 4)", "rdv_recover_dead", "rdv_recover.c (layer 8)", "higher layer"):
        assert text in upward, upward
    for text in ("rdv_lease.c (layer 7)", "rdv_mark_get_impl", "rdv_mark.c (layer 7)", "same layer"):
        assert text in sideways, sideways
    private = check_top_layer(scratch_csrc, objects, LAYERS, nm)
    assert len(private) == 1 and "rdv_inspect.c (layer 10) defines rdv_inspect_probe_private" in private[0], private


def test_checker_reports_table_drift(scratch_csrc):
    (scratch_csrc / "rdv_extra.c").write_text("/* Layer 4: new */\n")
    stale = dict(LAYERS, rdv_gone=3)
    problems = check_table(scratch_csrc, stale)
    assert len(problems) == 2, problems
    assert "rdv_extra.c is not in the layer table" in problems[0]
    assert "'rdv_gone'" in problems[1]


def test_checker_reports_raw_atomics(scratch_csrc):
    _edit(scratch_csrc / "rdv_arena.c", "    return READ_ONCE(h->kside[g]);",
          "    return __atomic_load_n(&h->kside[g], __ATOMIC_RELAXED);")
    problems = check_atomics(scratch_csrc)
    assert len(problems) == 1 and "rdv_arena.c:" in problems[0] and "__atomic_load_n" in problems[0], problems


def test_checker_reports_wrong_layer_comment(scratch_csrc):
    _edit(scratch_csrc / "rdv_queue.h", "/* Layer 6:", "/* Layer 3:")
    problems = check_layer_notes(scratch_csrc, LAYERS)
    assert problems == ["rdv_queue.h's first comment says Layer 3, the layer table says 6"], problems
