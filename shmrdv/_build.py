"""cffi (API mode) build of the C core in csrc/ into the private module shmrdv._native.

The public header csrc/shmrdv.h doubles as the cdef.
"""
import os
from pathlib import Path

import cffi

_ROOT = Path(__file__).resolve().parent.parent
_CSRC = _ROOT / "csrc"

# SHMRDV_SANITIZE=1 builds the core under AddressSanitizer/UBSan (a test job
# then runs Python with the ASan runtime preloaded).
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if os.environ.get("SHMRDV_SANITIZE") else []

ffibuilder = cffi.FFI()
ffibuilder.cdef((_CSRC / "shmrdv.h").read_text())
ffibuilder.set_source(
    "shmrdv._native",
    "#include <stdint.h>\n#include \"shmrdv.h\"\n",
    sources=sorted(os.path.relpath(p, _ROOT) for p in _CSRC.glob("*.c")),
    include_dirs=[os.path.relpath(_CSRC, _ROOT)],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-fvisibility=hidden", *SANITIZE],
    extra_link_args=SANITIZE,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
