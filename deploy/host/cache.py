"""Host side of the incremental push: a content-addressed file cache and the payload built
from it.

    <workdir>/cache/files/<sha256>   one verified copy of every content ever received (0400)
    <workdir>/cache/verified/<sha256>  the stat signature (size, mtime, inode) the file had
                                     when its hash was verified: a file whose signature changed
                                     since (edited, truncated, replaced) is hashed again before
                                     it is used, and dropped when its content is wrong
    <workdir>/cache/tmp/             partial receipts, each under a name of its own writer's;
                                     a file is linked into files/ only after its hash matched,
                                     so an interrupted transfer leaves at most orphans here,
                                     never a wrong file in files/
    <workdir>/prune.lock             held shared while a push counts on cached files, and
                                     exclusively while a prune deletes some (pruning_lock)
    <rundir>/manifest.json           what payload/ must hold: [path, sha256, mode, size]
    <rundir>/payload/                assembled in <rundir>/.payload-* and renamed into place,
                                     so a half-sent payload is never run

The cache is outside every run directory and survives teardown: that is what makes the next
push of an unchanged file free. Hosts sharing the workdir (docs/shared-homes.md) use it at the
same moment: whatever one writes is written under a name of its own and linked or renamed
into place, and no listed directory ever holds a half-written file.
"""
import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tempfile

from deploy.host import share
from deploy.host.layout import MANIFEST, PAYLOAD, PRUNE_LOCK
from deploy.host.rundir import write_atomic

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


def signature(st):
    """What identifies one verified version of a cached file: its size, mtime and inode."""
    return "%d %d %d" % (st.st_size, st.st_mtime_ns, st.st_ino)


def _remember(cache, digest, st):
    """Record `st`, the stat of the file whose content was just verified as `digest`. Taken
    from that very file (not from files/<digest> afterwards): if another host has replaced
    files/<digest> meanwhile, the signature does not match it, and it is hashed again."""
    folder = os.path.join(cache, "verified")
    os.makedirs(folder, exist_ok=True)
    write_atomic(os.path.join(folder, digest), signature(st))


def usable(cache, digest):
    """Whether files/<digest> holds that content: its signature is the one recorded when it was
    verified, or else its content is hashed again (and a wrong file removed)."""
    path = cached(cache, digest)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False
        with open(os.path.join(cache, "verified", digest)) as f:
            if f.read() == signature(st):
                return True
    except FileNotFoundError:
        pass
    hasher = hashlib.sha256()
    try:
        with open(path, "rb", opener=_no_follow) as f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                hasher.update(chunk)
            st = os.fstat(f.fileno())
    except FileNotFoundError:
        return False                # gone meanwhile (a prune, or a host that dropped it)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return False            # a symbolic link: never ours
        raise
    if hasher.hexdigest() != digest:
        _drop(cache, digest, st)
        return False
    _remember(cache, digest, st)
    return True


def _no_follow(path, flags):
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _drop(cache, digest, wrong):
    """Remove files/<digest>, found wrong as `wrong` (its stat), without ever removing a right
    one: hosts sharing the workdir may find the same wrong file at once, and one of them may
    already have stored the right content in its place. The file is moved aside (atomic), and
    put back when what was moved is not the wrong file."""
    path = cached(cache, digest)
    aside = os.path.join(cache, "tmp", "%s.%d.%s.wrong" % (
        digest[:16], os.getpid(), os.urandom(4).hex()))
    _folders(cache)
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return                      # another host removed it first
    try:
        if os.lstat(aside).st_ino != wrong.st_ino:
            _link_if_absent(aside, path)
    finally:
        os.unlink(aside)


def _link_if_absent(source, path):
    """Give `source` the name `path` unless that name exists; whether it did."""
    try:
        os.link(source, path)
        return True
    except FileExistsError:
        return False


@contextlib.contextmanager
def pruning_lock(cache, exclusive):
    """Held shared while a push decides which cached files it will use, exclusively while a
    prune decides which to delete: a prune sees the manifest of every run that already
    counted on a cached file, and a push never counts on a file a prune is deleting. A lock of
    the whole file with fcntl (POSIX record locks), which NFS carries between machines."""
    workdir = os.path.dirname(cache)
    os.makedirs(workdir, exist_ok=True)
    fd = os.open(os.path.join(workdir, PRUNE_LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError as exc:
            # An NFS mount without a lock manager: a push goes on without the lock (only a
            # prune at that very moment could then cost it a file) rather than fail.
            if exc.errno != errno.ENOLCK:
                raise
        yield
    finally:
        os.close(fd)           # releases the lock


def want(rundir, cache, member=None, riders=None):
    """The hashes of the manifest that the cache does not hold yet. `riders` (sha256 -> bytes:
    small files that came with the stage) are verified and cached first. When the cache holds
    them all, payload/ is assembled right away, saving the controller a round trip. `member`
    (host name, its tasks) is recorded in the run directory; the answer names the filesystem,
    so that the controller sends a workdir that hosts share only once."""
    answer = {}
    if member:
        share.join(rundir, member[0], [t for t in member[1].split(",") if t])
        answer["filesystem"] = share.filesystem_id(os.path.dirname(cache))
    files = read_manifest(rundir)
    with pruning_lock(cache, exclusive=False):
        received = take_riders(cache, riders or {}, {d: size for _, d, _, size in files})
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


def take_riders(cache, riders, expected):
    """Cache the files that came with the stage (sha256 -> bytes) after checking their hashes;
    the ones the cache lacked. They never touch the run directory: hosts sharing the workdir
    take the same riders at once, each through a temporary file of its own (_store)."""
    taken = []
    if riders:
        _folders(cache)
    for digest, content in sorted(riders.items()):
        if expected.get(digest) != len(content):
            raise CacheError("unexpected inline file %r" % digest)
        if not usable(cache, digest):
            _store(cache, digest, io.BytesIO(content), len(content))
            taken.append(digest)
    return taken


def receive(rundir, cache, stream):
    """Cache every file of the `stream` after checking its hash, then assemble payload/ from
    the cache."""
    files = read_manifest(rundir)
    expected = {d: size for _, d, _, size in files}
    _folders(cache)
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
        total += _store(cache, digest, stream, size, buf)
        received.append(digest)
    return {"received": received, "bytes": total, "files": assemble(rundir, cache, files)}


def _folders(cache):
    """tmp/ and files/, before files are stored (_store)."""
    os.makedirs(os.path.join(cache, "tmp"), exist_ok=True)
    os.makedirs(os.path.join(cache, "files"), exist_ok=True)


def _widen(stream):
    """Let the pipe from sshd hold 1 MiB instead of 64 KiB (Linux), so that the stream keeps
    coming while a file is created or renamed here, instead of stalling sshd's window."""
    try:
        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError, ValueError):
        pass          # not a pipe, not Linux, or not allowed: the default size works too


def _store(cache, digest, source, size, buf=None):
    """Copy `size` bytes of `source` into the cache as `digest`, hashing while writing; the file
    enters files/ only when the hash matched. One reused buffer, written straight to the file
    descriptor: no new bytes object per chunk.

    Hosts sharing the workdir may store one content at once: each writes a temporary file of
    its own in tmp/ and links it into files/ only if no file has that name yet, so the first
    one stays (and the signature recorded is that of a file verified, whoever's it is). A file
    found there with the wrong content is replaced."""
    view = memoryview(buf if buf is not None else bytearray(min(CHUNK, max(size, 1))))
    # Random, not the pid alone: hosts sharing the workdir share this directory too.
    tmp = os.path.join(cache, "tmp", "%s.%d.%s" % (
        digest[:16], os.getpid(), os.urandom(4).hex()))
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
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if hasher.hexdigest() != digest:
            raise CacheError("content of %s arrived with hash %s" % (digest, hasher.hexdigest()))
        if _link_if_absent(tmp, cached(cache, digest)):
            _remember(cache, digest, st)
        elif not usable(cache, digest):
            os.replace(tmp, cached(cache, digest))
            _remember(cache, digest, st)
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
