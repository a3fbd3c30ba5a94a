"""The C part of txlog (app/_native.c): the per-record loops of the hot paths. Optional: without a
C compiler the package installs without it and runs the Python definitions it accelerates."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("app._native", ["app/_native.c"], optional=True)])
