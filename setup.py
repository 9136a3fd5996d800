# The C core is compiled by cffi (API mode) from csrc/ at install time into
# shmrdv._native; shmrdv._fastpath, the hot paths against CPython and numpy,
# calls that one core through the addresses _native gives it.
import importlib.util

import numpy
from setuptools import Extension, setup

# shmrdv/_build.py by path: the package itself cannot be imported before it is built
_spec = importlib.util.spec_from_file_location("shmrdv_build", "shmrdv/_build.py")
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)

setup(
    cffi_modules=["shmrdv/_build.py:ffibuilder"],
    ext_modules=[
        Extension(
            "shmrdv._fastpath",
            sources=["shmrdv/_fastpath.c"],
            include_dirs=["csrc", numpy.get_include()],
            # numpy's C API as 1.24 has it, the oldest numpy shmrdv runs with,
            # whatever numpy it is built against
            define_macros=[("NPY_TARGET_VERSION", "NPY_1_24_API_VERSION")],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", *_build.SANITIZE],
            extra_link_args=_build.SANITIZE,
        )
    ],
)
