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

Verbs (main.py names them data-want, data-receive, data-push):
    want RUNDIR DATADIR CACHE      <rundir>/data-manifest.json: which contents the cache lacks;
                                   when it lacks none, DATADIR is assembled at once
    receive RUNDIR DATADIR CACHE   those contents on stdin (cache.py's file stream): verify,
                                   cache, assemble DATADIR
    push RUNDIR DATADIR CACHE      want, answered as a line; then, unless DATADIR is there
                                   already, receive on the same stdin (one command per push)
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile

from deploy.host import cache as cache_files
from deploy.host.layout import DATA_MANIFEST as MANIFEST
from deploy.host.layout import MANIFEST as PAYLOAD_MANIFEST
from deploy.host.layout import PAYLOAD


def checked_manifest(rundir, datadir):
    """The manifest's files, after checking that DATADIR is named by its hash."""
    with open(os.path.join(rundir, MANIFEST), "rb") as f:
        raw = f.read()
    tree = hashlib.sha256(raw).hexdigest()
    if os.path.basename(datadir) != tree:
        raise cache_files.CacheError("data directory %s is not named by its manifest's hash %s"
                                     % (datadir, tree))
    return json.loads(raw)["files"]


def staging(rundir):
    """A directory inside the run directory holding the manifest as cache.py expects it;
    cache.py assembles <staging>/payload there (a leftover goes with the run directory)."""
    tmp = tempfile.mkdtemp(prefix=".data-", dir=rundir)
    shutil.copyfile(os.path.join(rundir, MANIFEST), os.path.join(tmp, PAYLOAD_MANIFEST))
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
    if os.path.isdir(datadir):
        return {"present": True, "missing": [], "received": [], "files": len(files)}
    tmp = staging(rundir)
    try:
        answer = cache_files.want(tmp, cache)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if answer.get("assembled"):
        place(tmp, datadir)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return dict(answer, present=False)


def receive(rundir, datadir, cache, stream):
    checked_manifest(rundir, datadir)
    tmp = staging(rundir)
    try:
        answer = cache_files.receive(tmp, cache, stream)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    place(tmp, datadir)
    return dict(answer, present=False)


def push(rundir, datadir, cache, stdin, stdout):
    answer = want(rundir, datadir, cache)
    stdout.write(json.dumps(dict(answer, **cache_files.room(cache))) + "\n")   # as cache.push
    stdout.flush()
    if answer["present"] or answer.get("assembled"):
        return None
    return receive(rundir, datadir, cache, stdin)


def main(argv):
    verb, rundir, datadir, cache = argv[0], *(os.path.expanduser(a) for a in argv[1:4])
    try:
        if verb == "want":
            out = want(rundir, datadir, cache)
        elif verb == "push":
            out = push(rundir, datadir, cache, sys.stdin.buffer, sys.stdout)
        elif verb == "receive":
            out = receive(rundir, datadir, cache, sys.stdin.buffer)
        else:
            raise SystemExit("unknown verb %r" % verb)
    except (cache_files.CacheError, OSError, ValueError, KeyError) as exc:
        raise SystemExit(cache_files.failure("data", verb, exc, cache))
    return out
