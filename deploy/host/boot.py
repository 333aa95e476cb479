"""The first code a host's agent runs: it loads this package from memory and serves requests.

The controller starts `python -I -c BOOT` (deploy/plan/planner.py agent_command), and BOOT
executes what comes first on stdin: this file, headed by its length. Then comes the package
itself, its modules' sources as one compressed JSON object headed by its length
(deploy/cluster/hostzip.py host_sources), imported from memory; nothing is written on the host
before the checks have said that it may be. Then the requests (agent.py). Not the zip the
supervisors run (tfdeploy-host.zip): importing zipfile would cost every agent's start more
than all the rest of its loading.

This file alone must parse and run its first lines on any Python 3 a lab server may have: an
interpreter older than the package's oldest is refused in words (too_old), never by a traceback
from whichever module first uses what it lacks. (Python 2 refuses `-I` itself.)
"""
import json
import sys
import zlib
from importlib.machinery import ModuleSpec

# The oldest Python the host package runs on: it uses typing.get_args and
# threading.get_native_id, both new in 3.8.
OLDEST_PYTHON = (3, 8)
# The agent's exit status when its Python is older; the controller names it (hostagent.py).
TOO_OLD = 79


def too_old():
    """Why this Python cannot run the host package, or None."""
    if sys.version_info >= OLDEST_PYTHON:
        return None
    return "%s is Python %s; tfdeploy's host agent needs Python %d.%d or newer" % (
        sys.executable, sys.version.split()[0], OLDEST_PYTHON[0], OLDEST_PYTHON[1])


# Where a traceback on a host says the package's code is: no file there has it.
ORIGIN = "tfdeploy-host/"


class SourcesInMemory:
    """An importer of the package's modules from their sources held in memory: {path in the
    package ("deploy/host/agent.py"): source}."""

    def __init__(self, sources):
        self.sources = sources
        self.names = set(sources)

    def _file(self, fullname):
        base = fullname.replace(".", "/")
        for name, package in ((base + "/__init__.py", True), (base + ".py", False)):
            if name in self.names:
                return name, package
        return None, False

    def find_spec(self, fullname, path=None, target=None):
        name, package = self._file(fullname)
        if name is None:
            return None
        return ModuleSpec(fullname, self, origin=ORIGIN + name, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = self.get_source(module.__name__)
        module.__file__ = module.__spec__.origin
        exec(compile(source, module.__file__, "exec"), module.__dict__)

    def get_source(self, fullname):
        return self.sources[self._file(fullname)[0]]


def unpacked(package):
    """The sources in the package as host_sources made it."""
    return json.loads(zlib.decompress(package).decode("utf-8"))


def load(stream):
    """Read the package (its length on a line, then the compressed sources) from `stream` and
    make it importable."""
    size = int(stream.readline())
    sys.meta_path.insert(0, SourcesInMemory(unpacked(stream.read(size))))


if __name__ == "__main__":
    if too_old():
        sys.stderr.write(too_old() + "\n")
        sys.exit(TOO_OLD)
    load(sys.stdin.buffer)
    from deploy.host.agent import serve
    serve(sys.stdin.buffer, sys.stdout.buffer)
