# The C core is compiled by cffi (API mode) from csrc/ at install time.
from setuptools import setup

setup(cffi_modules=["shmrdv/_build.py:ffibuilder"])
