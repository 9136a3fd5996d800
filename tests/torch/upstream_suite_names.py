"""What the pytest side knows of PyTorch's distributed suite without
importing it (importing it runs its decorators, which read BACKEND and
WORLD_SIZE): the case names, read from the installed file's source, and
the line that says why a case failed."""
import ast
import functools
import importlib.util
import re
from typing import List

SUITE_MODULE = "torch.testing._internal.distributed.distributed_test"
SUITE_CLASS = "_DistTestBase"
# A line such as "RuntimeError: ..." or "torch.distributed.DistBackendError: ...".
_ERROR = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Timeout|Aborted|Exit)|AssertionError)\b:?")
# The harness's own wrapper around a rank's traceback.
_WRAPPER = re.compile(r"^RuntimeError: Process \d+ exited with error code")


@functools.lru_cache(maxsize=None)
def suite_cases() -> List[str]:
    """The test methods of DistributedTest._DistTestBase, in source order."""
    spec = importlib.util.find_spec(SUITE_MODULE)
    assert spec is not None and spec.origin is not None, f"{SUITE_MODULE} is not in this torch"
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == SUITE_CLASS:
            return [f.name for f in node.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    raise AssertionError(f"no class {SUITE_CLASS} in {spec.origin}")


def error_line(detail: str) -> str:
    """The last exception line of a case's report, the harness's wrapper
    excepted (for a timeout, the harness's own line)."""
    lines = [ln.strip() for ln in detail.splitlines()]
    found = [ln for ln in lines if _ERROR.match(ln) and not _WRAPPER.match(ln)]
    if found:
        return found[-1][:300]
    return next((ln for ln in reversed(lines) if ln), "(no message)")[:300]


__all__ = ["error_line", "suite_cases"]
