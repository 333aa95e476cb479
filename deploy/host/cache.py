"""Host side of the incremental push: a content-addressed file cache and the payload built
from it.

    <workdir>/cache/files/<sha256>   one verified copy of every content ever received (0400)
    <workdir>/cache/verified/<sha256>  the stat signature (size, mtime, inode) the file had
                                     when its hash was verified: a file whose signature changed
                                     since (edited, truncated, replaced) is hashed again before
                                     it is used, and dropped when its content is wrong
    <workdir>/cache/tmp/             partial receipts; a file moves to files/ only after its
                                     hash matched, so an interrupted transfer leaves at most
                                     orphans here, never a wrong file in files/
    <rundir>/manifest.json           what payload/ must hold: [path, sha256, mode, size]
    <rundir>/payload/                assembled in <rundir>/.payload-* and renamed into place,
                                     so a half-sent payload is never run

The cache is outside every run directory and survives teardown: that is what makes the next
push of an unchanged file free.
"""
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile

from deploy.host import share
from deploy.host.layout import INLINE as INLINE_DIR
from deploy.host.layout import MANIFEST, PAYLOAD

HEX64 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20
PIPE_BYTES = 1 << 20
# The file stream: MAGIC, then per file a line "<sha256> <size>" and its bytes, then END.
# Plain framing rather than tar: reading a tar stream in Python costs more CPU than the
# transfer itself, and END tells a complete stream from a cut one.
MAGIC = b"tfdeploy-files 1\n"
END = b"end\n"


class CacheError(Exception):
    pass


def read_manifest(rundir):
    with open(os.path.join(rundir, MANIFEST)) as f:
        files = json.load(f)["files"]
    for path, digest, mode, size in files:
        parts = path.split("/")
        if (path.startswith("/") or any(p in ("", ".", "..") for p in parts)
                or not HEX64.match(digest) or mode not in (0o644, 0o755) or size < 0):
            raise CacheError("bad manifest entry %r" % (path,))
    return files


def cached(cache, digest):
    return os.path.join(cache, "files", digest)


def signature(path):
    st = os.lstat(path)
    return "%d %d %d" % (st.st_size, st.st_mtime_ns, st.st_ino)


def _remember(cache, digest):
    """Record the signature of files/<digest>, whose content was just verified."""
    folder = os.path.join(cache, "verified")
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, "%s.%s" % (digest, secrets.token_hex(8)))
    with open(tmp, "w") as f:
        f.write(signature(cached(cache, digest)))
    os.replace(tmp, os.path.join(folder, digest))


def usable(cache, digest):
    """Whether files/<digest> holds that content: its signature is the one recorded when it was
    verified, or else its content is hashed again (and a wrong file removed)."""
    path = cached(cache, digest)
    try:
        if not os.path.isfile(path) or os.path.islink(path):
            return False
        with open(os.path.join(cache, "verified", digest)) as f:
            if f.read() == signature(path):
                return True
    except FileNotFoundError:
        pass
    hasher = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                hasher.update(chunk)
    except FileNotFoundError:
        return False
    if hasher.hexdigest() != digest:
        os.unlink(path)
        return False
    _remember(cache, digest)
    return True


def want(rundir, cache, member=None):
    """The hashes of the manifest that the cache does not hold yet. When it holds them all,
    payload/ is assembled right away, saving the controller a round trip. `member` (host name,
    its tasks) is recorded in the run directory; the answer names the filesystem, so that the
    controller sends a workdir that hosts share only once."""
    answer = {}
    if member:
        share.join(rundir, member[0], [t for t in member[1].split(",") if t])
        answer["filesystem"] = share.filesystem_id(os.path.dirname(cache))
    files = read_manifest(rundir)
    received = take_inline(rundir, cache, {d for _, d, _, _ in files})
    missing = sorted({d for _, d, _, _ in files if not usable(cache, d)})
    if not missing:
        return dict(answer, missing=[], received=received, assembled=True,
                    files=assemble(rundir, cache, files))
    return dict(answer, missing=missing, received=received, files=len(files))


def room(cache):
    """Free bytes (for this user) on the cache's filesystem, and where they were measured."""
    path = cache
    while not os.path.isdir(path):
        path = os.path.dirname(path) or "."
    st = os.statvfs(path)
    return {"disk_free": st.f_bavail * st.f_frsize, "disk_path": path}


def failure(what, verb, exc, cache, host=None):
    """The message of a failed push; a full disk in words a user acts on, naming where."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        where = room(cache)["disk_path"]
        return "%s %s: no space left on %s disk in %s" % (
            what, verb, "%s's" % host if host else "the host's", where)
    return "%s %s: %s" % (what, verb, exc)


def take_inline(rundir, cache, expected):
    """Cache the files that came with the manifest (after checking their hashes)."""
    inline = os.path.join(rundir, INLINE_DIR)
    if not os.path.isdir(inline):
        return []
    os.makedirs(os.path.join(cache, "tmp"), exist_ok=True)
    os.makedirs(os.path.join(cache, "files"), exist_ok=True)
    taken = []
    # A host sharing the workdir may be taking the same files at once: a file it took first is
    # in the cache, and whatever is left here goes with the run directory.
    for digest in sorted(os.listdir(inline)):
        if digest not in expected:
            raise CacheError("unexpected inline file %r" % digest)
        path = os.path.join(inline, digest)
        try:
            if not usable(cache, digest):
                with open(path, "rb") as source:
                    _store(cache, os.path.join(cache, "tmp"), digest, source,
                           os.fstat(source.fileno()).st_size)
                taken.append(digest)
            os.unlink(path)
        except FileNotFoundError:
            if not usable(cache, digest):
                raise
    try:
        os.rmdir(inline)
    except OSError:
        pass
    return taken


def receive(rundir, cache, stream):
    """Cache every file of the `stream` after checking its hash, then assemble payload/ from
    the cache."""
    files = read_manifest(rundir)
    expected = {d: size for _, d, _, size in files}
    tmpdir = os.path.join(cache, "tmp")
    os.makedirs(tmpdir, exist_ok=True)
    os.makedirs(os.path.join(cache, "files"), exist_ok=True)
    _widen(stream)
    if stream.readline() != MAGIC:
        raise CacheError("the file stream does not start with %r" % MAGIC)
    received, total, buf = [], 0, bytearray(CHUNK)
    while True:
        line = stream.readline(200)
        if line == END:
            break
        try:
            digest, size = line.decode("ascii").split()
            size = int(size)
        except ValueError:
            raise CacheError("file stream cut short or garbled at %r" % line[:80]) from None
        if expected.get(digest) != size:
            raise CacheError("unexpected file %s (%d bytes) in the stream" % (digest, size))
        total += _store(cache, tmpdir, digest, stream, size, buf)
        received.append(digest)
    return {"received": received, "bytes": total, "files": assemble(rundir, cache, files)}


def _widen(stream):
    """Let the pipe from sshd hold 1 MiB instead of 64 KiB (Linux), so that the stream keeps
    coming while a file is created or renamed here, instead of stalling sshd's window."""
    try:
        import fcntl
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, AttributeError, OSError, ValueError):
        pass          # not a pipe, not Linux, or not allowed: the default size works too


def _store(cache, tmpdir, digest, source, size, buf=None):
    """Copy `size` bytes of `source` into the cache as `digest`, hashing while writing; the file
    enters files/ only when the hash matched. One reused buffer, written straight to the file
    descriptor: no new bytes object per chunk."""
    view = memoryview(buf if buf is not None else bytearray(min(CHUNK, max(size, 1))))
    # Random, not the pid alone: hosts sharing the workdir share this directory too.
    tmp = os.path.join(tmpdir, "%s.%d.%s" % (digest[:16], os.getpid(), secrets.token_hex(4)))
    fd = _create(tmp)
    try:
        hasher, left = hashlib.sha256(), size
        try:
            while left:
                n = source.readinto(view[:min(len(view), left)])
                if not n:
                    raise CacheError("file stream cut short in %s" % digest)
                hasher.update(view[:n])
                _write_all(fd, view[:n])
                left -= n
        finally:
            os.close(fd)
        if hasher.hexdigest() != digest:
            raise CacheError("content of %s arrived with hash %s" % (digest, hasher.hexdigest()))
        os.replace(tmp, cached(cache, digest))
        _remember(cache, digest)
        return size
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _create(path):
    """A new read-only file open for writing (the mode is set at creation, under the umask:
    no chmod after).
    A leftover of an earlier receipt by a process with the same pid is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o444)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o444)


def _write_all(fd, view):
    while view:
        view = view[os.write(fd, view):]


def assemble(rundir, cache, files):
    """Build payload/ in a temporary directory beside it and rename it into place. Plain files
    are hard links into the cache (read-only, so an in-place write fails instead of changing
    the cache); executables are copies, because a link shares the cache file's mode. A
    payload/ already there was assembled by another host of this run that shares the workdir
    (the run directory's name is the run's own id): it is this very payload."""
    final = os.path.join(rundir, PAYLOAD)
    if os.path.isdir(final):
        return len(files)
    tmp = tempfile.mkdtemp(prefix=".payload-", dir=rundir)
    made = {tmp}
    mask = os.umask(0)
    os.umask(mask)
    try:
        for path, digest, mode, size in files:
            source, dest = cached(cache, digest), os.path.join(tmp, *path.split("/"))
            if not usable(cache, digest) or os.path.getsize(source) != size:
                raise CacheError("cached %s is missing or has the wrong content" % digest)
            parent = os.path.dirname(dest)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            if mode == 0o644 and _link(source, dest):
                continue
            shutil.copyfile(source, dest)
            os.chmod(dest, mode & ~mask)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
            shutil.rmtree(tmp)     # another host sharing the workdir was first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(files)


def _link(source, dest):
    try:
        os.link(source, dest)
        return True
    except OSError:  # a filesystem without hard links: copy instead
        return False
