"""A push's first step on the host: refuse an unsafe workdir, then unpack the stage (run.json,
this package as tfdeploy-host.zip, the manifest, small recent files) into the run directory.

Each file is written beside its place and renamed into it: hosts sharing the workdir unpack
the same files at once, and one of them may be running the host package already.
"""
import errno
import io
import os
import shutil
import tarfile

from deploy.host.check import unsafe_workdir


class StageError(Exception):
    pass


def unpack_stage(rundir, stage):
    """Unpack the tar.gz `stage` (bytes) into `rundir`, <workdir>/runs/<run-id>, after checking
    that the workdir is the user's own and closed to others: nothing is written otherwise."""
    problem = unsafe_workdir(os.path.dirname(os.path.dirname(rundir)))
    if problem:
        raise StageError(problem)
    with tarfile.open(fileobj=io.BytesIO(stage), mode="r:gz") as tar:
        members = tar.getmembers()
        for member in members:
            if not member.isfile() or member.name.startswith("/") or \
                    ".." in member.name.split("/"):
                raise StageError("bad stage entry %r" % member.name)
        new = not os.path.isdir(rundir)
        try:
            for member in members:
                path = os.path.join(rundir, member.name)
                tmp = "%s.%s" % (path, os.urandom(6).hex())
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(tmp, "wb") as out:
                    out.write(tar.extractfile(member).read())
                os.replace(tmp, path)
        except OSError as exc:
            # A stage that cannot be written (a full disk) takes the run directory it made
            # with it: nothing of the run is left for a teardown to find.
            if new:
                shutil.rmtree(rundir, ignore_errors=True)
            if exc.errno == errno.ENOSPC:
                raise StageError("no space left on the host's disk in %s" % rundir) from None
            raise StageError("cannot unpack into %s: %s" % (rundir, exc)) from None
