"""A push's first step on the host: refuse an unsafe workdir, then unpack the stage (run.json,
the manifest) into the run directory, and hand back the small files that rode along
(inline/<sha256>) for the cache to verify and take (cache.want).

Hosts sharing the workdir unpack the same stage into the same run directory at once, and one of
them may be reading the manifest already: each file is written beside its place under a name of
this writer's own and renamed into it (the same bytes, whichever rename comes last).
The riders never enter the run directory, where another host would list them.
"""
import errno
import io
import os
import shutil
import tarfile

from deploy.host.cache import HEX64
from deploy.host.probe import unsafe_workdir
from deploy.host.layout import INLINE
from deploy.host.rundir import write_atomic


class StageError(Exception):
    pass


def unpack_stage(rundir, stage):
    """Unpack the tar.gz `stage` (bytes) into `rundir`, <workdir>/runs/<run-id>, after checking
    that the workdir is the user's own and closed to others: nothing is written otherwise.
    Returns the riders, sha256 -> bytes, unwritten."""
    problem = unsafe_workdir(os.path.dirname(os.path.dirname(rundir)))
    if problem:
        raise StageError(problem)
    riders, files = {}, {}
    with tarfile.open(fileobj=io.BytesIO(stage), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if not member.isfile() or member.name.startswith("/") or ".." in parts:
                raise StageError("bad stage entry %r" % member.name)
            content = tar.extractfile(member).read()
            if parts[0] == INLINE:
                if len(parts) != 2 or not HEX64.match(parts[1]):
                    raise StageError("bad stage entry %r" % member.name)
                riders[parts[1]] = content
            else:
                files[member.name] = content
    new = False
    try:
        os.makedirs(os.path.dirname(rundir), exist_ok=True)
        try:
            os.mkdir(rundir)
            new = True       # this host made it, so a failure here takes it away
        except FileExistsError:
            pass             # another host sharing the workdir did, or an earlier step
        for name, content in files.items():
            path = os.path.join(rundir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, content)
    except OSError as exc:
        # A stage that cannot be written (a full disk) takes the run directory it made
        # with it: nothing of the run is left for a teardown to find.
        if new:
            shutil.rmtree(rundir, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise StageError("no space left on the host's disk in %s" % rundir) from None
        raise StageError("cannot unpack into %s: %s" % (rundir, exc)) from None
    return riders
