# setuptools reads everything from pyproject.toml; cffi_modules has no
# pyproject key yet, so it is declared here.
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
