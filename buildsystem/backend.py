"""The project's build backend: setuptools', behind a check of the Python it installs for.

pip asks the backend first (for the project's metadata), before it resolves a dependency, so
an older Python is refused here in one sentence, whatever pip's resolver would make of
TensorFlow's releases for it (backtracking for minutes on 3.9, "No matching distribution" on
3.8). This file must parse on any Python 3.
"""
import sys

OLDEST_PYTHON = (3, 10)      # requires-python in pyproject.toml; TensorFlow 2.21's oldest

if sys.version_info < OLDEST_PYTHON:
    sys.exit("tfdeploy needs Python %d.%d or newer; %s is Python %s" % (
        OLDEST_PYTHON[0], OLDEST_PYTHON[1], sys.executable, sys.version.split()[0]))

from setuptools.build_meta import *  # noqa: E402,F401,F403  (every hook, as setuptools has it)
