"""Host side of the data push: a local `data:` directory kept on the host by content.
It reuses the verified file cache and the atomic assembly of cache.py.

    <workdir>/cache/files/<sha256>   the same content cache as the payload's (files verified
                                     by hash before they enter it)
    <workdir>/data/<tree sha256>     the data directory: read-only hard links into the cache,
                                     assembled inside the run directory and renamed into place,
                                     so it exists complete or not at all. Its name is the hash
                                     of its manifest, checked here: the same name always means
                                     the same files. Outside every run directory: teardown never
                                     deletes it, and the next run with the same data finds it.

Asked by the agent (agent.py: the requests data-push, then data-receive):
    want(RUNDIR, DATADIR, CACHE)   <rundir>/data-<tree>.json: which contents the cache lacks;
                                   when it lacks none, DATADIR is assembled at once. The
                                   answer names the filesystem: hosts that share it and push
                                   the same tree are sent its files once
    receive(RUNDIR, DATADIR, CACHE, STREAM)   those contents (cache.py's file stream): verify,
                                   cache, assemble DATADIR
"""
import hashlib
import json
import os
import shutil
import tempfile

from deploy.host import cache as cache_files
from deploy.host import share
from deploy.host.layout import MANIFEST as PAYLOAD_MANIFEST
from deploy.host.layout import PAYLOAD, data_manifest


def manifest_path(rundir, datadir):
    """<rundir>/data-<tree>.json, the manifest of the tree DATADIR is named by."""
    tree = os.path.basename(datadir)
    if not cache_files.HEX64.match(tree):
        raise cache_files.CacheError("data directory %s is not named by a tree's sha256"
                                     % datadir)
    return os.path.join(rundir, data_manifest(tree))


def checked_manifest(rundir, datadir):
    """The manifest's files, after checking that DATADIR is named by its hash."""
    path = manifest_path(rundir, datadir)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise cache_files.CacheError("data directory %s is not named by its manifest's hash: "
                                     "the stage brought no %s" % (datadir, path)) from None
    tree = hashlib.sha256(raw).hexdigest()
    if os.path.basename(datadir) != tree:
        raise cache_files.CacheError("data directory %s is not named by its manifest's hash %s"
                                     % (datadir, tree))
    return json.loads(raw)["files"]


def staging(rundir, datadir):
    """A directory of this host's own inside the run directory holding the manifest as cache.py
    expects it; cache.py assembles <staging>/payload there (a leftover goes with the run
    directory)."""
    tmp = tempfile.mkdtemp(prefix=".data-", dir=rundir)
    shutil.copyfile(manifest_path(rundir, datadir), os.path.join(tmp, PAYLOAD_MANIFEST))
    return tmp


def place(tmp, datadir):
    """Rename the assembled tree to DATADIR. Another run that placed the same tree first
    (same name, so same content) wins; ours is dropped."""
    os.makedirs(os.path.dirname(datadir), exist_ok=True)
    try:
        os.rename(os.path.join(tmp, PAYLOAD), datadir)
    except OSError:
        if not os.path.isdir(datadir):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def want(rundir, datadir, cache):
    files = checked_manifest(rundir, datadir)
    filesystem = share.filesystem_id(os.path.dirname(cache))
    if os.path.isdir(datadir):
        return {"present": True, "missing": [], "received": [], "files": len(files),
                "filesystem": filesystem}
    tmp = staging(rundir, datadir)
    try:
        answer = cache_files.want(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if answer.get("assembled"):
        place(tmp, datadir)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return dict(answer, present=False, filesystem=filesystem)


def receive(rundir, datadir, cache, stream):
    checked_manifest(rundir, datadir)
    tmp = staging(rundir, datadir)
    try:
        answer = cache_files.receive(tmp, cache, stream)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    place(tmp, datadir)
    return dict(answer, present=False)
