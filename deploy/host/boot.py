"""The first code a host's agent runs: it loads this package from memory and serves requests.

The controller starts `python -I -c BOOT` (deploy/plan/planner.py agent_command), and BOOT
executes what comes first on stdin: this file, headed by its length. Then comes the package
itself, its modules' sources as one compressed JSON object headed by its length
(deploy/cluster/hostcode.py host_sources), imported from memory; nothing is written on the host
before the checks have said that it may be. Then the folder of the host's cache where the
package's compiled code is kept, headed by its length; then the requests (agent.py). Not a zip:
importing zipfile would cost every agent's start more than all the rest of its loading.

Compiling the sources is a third of an agent's start. A run's push (once the checks allow
writing) keeps the compiled code in that folder (SourcesInMemory.keep), named by the package's
and the Python's hash, and the next agent on this Python loads it from there: a file of this
user's own that it alone may write, or it is not read.

This file alone must parse and run its first lines on any Python 3 a lab server may have: an
interpreter older than the package's oldest is refused in words (too_old), never by a traceback
from whichever module first uses what it lacks. (Python 2 refuses `-I` itself.)
"""
import hashlib
import json
import marshal
import os
import stat
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
# The compiled code (a third of a MiB) is not kept on a disk with less room than this.
ROOM_TO_KEEP = 64 << 20


class SourcesInMemory:
    """An importer of the package's modules from their sources held in memory: {path in the
    package ("deploy/host/agent.py"): source}; their code compiled, or as `compiled` has it
    ({path: code}, what keep() wrote)."""

    def __init__(self, sources, compiled=None, kept_at=None):
        self.sources = sources
        self.names = set(sources)
        self.compiled = compiled or {}
        self.kept_at = kept_at       # where keep() writes the compiled code; None: nowhere

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
        name = self._file(module.__name__)[0]
        module.__file__ = module.__spec__.origin
        code = self.compiled.get(name)
        if code is None:
            code = compile(self.sources[name], module.__file__, "exec")
        exec(code, module.__dict__)

    def get_source(self, fullname):
        return self.sources[self._file(fullname)[0]]

    def keep(self):
        """Write every module's compiled code where the next agent on this Python finds it
        (kept_code), unless it came from there; the same Python's code of other packages is
        removed. Best effort: an agent that cannot write it compiles."""
        if self.kept_at is None or self.compiled:
            return
        folder, name = self.kept_at
        try:
            free = os.statvfs(os.path.dirname(folder))
            if free.f_bavail * free.f_frsize < ROOM_TO_KEEP:
                return         # the room is the payload's
        except OSError:
            return
        code = marshal.dumps({path: compile(source, ORIGIN + path, "exec")
                              for path, source in self.sources.items()})
        temporary = os.path.join(folder, "%s.%d.tmp" % (name, os.getpid()))
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(code)
            os.replace(temporary, os.path.join(folder, name))
            for other in os.listdir(folder):
                if other != name and other.startswith(_python_tag() + "-") and \
                        other.endswith(".code"):
                    os.unlink(os.path.join(folder, other))
        except OSError:
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _python_tag():
    return sys.implementation.cache_tag or sys.implementation.name


def code_name(package):
    """The name of `package`'s compiled code for this very Python: marshal's format and the
    bytecode change with its version."""
    digest = hashlib.sha256(package + sys.version.encode("utf-8")).hexdigest()
    return "%s-%s.code" % (_python_tag(), digest[:32])


def kept_code(folder, name):
    """The compiled code keep() wrote as `name` in `folder`: {} unless it is a regular file of
    this user's, writable by no one else, that reads as what keep() writes."""
    try:
        fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            status = os.fstat(f.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid() or \
                    status.st_mode & 0o022:
                return {}
            compiled = marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    code_type = type(kept_code.__code__)
    if not isinstance(compiled, dict) or \
            not all(isinstance(code, code_type) for code in compiled.values()):
        return {}
    return compiled


def unpacked(package):
    """The sources in the package as host_sources made it."""
    return json.loads(zlib.decompress(package).decode("utf-8"))


def _headed(stream):
    return stream.read(int(stream.readline()))


def importer_of(stream):
    """The importer of the package read from `stream` (its length on a line, then the
    compressed sources), whose compiled code lives in the folder that follows (its length,
    then the path; `~/` is the home)."""
    package = _headed(stream)
    folder = _headed(stream).decode("utf-8")
    if folder == "~" or folder.startswith("~/"):
        folder = os.path.expanduser(folder)
    name = code_name(package)
    return SourcesInMemory(unpacked(package), kept_code(folder, name), (folder, name))


if __name__ == "__main__":
    if too_old():
        sys.stderr.write(too_old() + "\n")
        sys.exit(TOO_OLD)
    importer = importer_of(sys.stdin.buffer)
    sys.meta_path.insert(0, importer)
    from deploy.host.agent import serve
    serve(sys.stdin.buffer, sys.stdout.buffer, importer.keep)
