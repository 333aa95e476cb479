"""Archives between a host and the controller: a folder packed as tar.gz (the chief's output,
its backup), and an archive from a host unpacked so that nothing in it reaches outside its
destination, on any Python. The controller unpacks the chief's output into
runs/<id>/artifacts with it; every other host unpacks the chief's backup with it (--restarts).

tarfile's extractall(filter="data") is not enough: before the fix of CVE-2025-4517 (3.10.18,
3.11.13, 3.12.11, 3.13.4) a chain of symbolic links longer than PATH_MAX made its realpath
check give up while the kernel still followed the links. Here nothing is ever followed:
- each member's path is walked one component at a time, every component opened relative to
  its parent's descriptor with O_NOFOLLOW (O_DIRECTORY for directories; files are created
  with O_CREAT|O_EXCL), so a link, planted or raced in, is never gone through;
- only regular files and directories with plain names are unpacked (no absolute name, no
  `..`, no empty or NUL component); links, devices, fifos and anything else are skipped and
  reported;
- modes keep the owner's bits only (no setuid, setgid or sticky bit, nothing for group or
  others), and a file is always readable and writable by its owner;
- a first pass counts members and bytes before anything is written: past the limits, or
  past the destination's free space, the archive is refused whole;
- tar's own headers are bounded before tarfile reads them: long-name and pax headers
  (which it reads whole into memory), global headers and sparse members (never in our
  archives; their maps could be any size) refuse the archive.
Standard library only: it travels with the host package.
"""
import errno
import io
import os
import stat
import tarfile
import zlib

from deploy.host.records import Frozen, record

# The default cap of one archive: room for real checkpoints; --max-fetch raises it.
MAX_BYTES = 8 << 30
MAX_MEMBERS = 100_000
# Free space left beside what an archive unpacks to (the filesystem's own blocks, the logs).
ROOM_MARGIN = 64 << 20
# Tar's headers of one member (its long name, its pax records) together; a path is at most
# a few KiB, so this is far beyond any real one.
MAX_META = 64 << 10
# Skipped members named one by one; beyond this only counted.
SHOWN = 20
PIECE = 1 << 20
_META_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
               tarfile.SOLARIS_XHDTYPE)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# A file read to be sent: never through a link, and a fifo planted there opens without
# waiting for a writer (it is then skipped as not a regular file).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
# The pax record by which a packed backup file carries its nanosecond mtime as the host saw
# it: with its size, what says whether the controller's copy of it is still current.
MTIME_NS = "TFDEPLOY.mtime_ns"
_FILE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
               getattr(os, "O_CLOEXEC", 0))
_KINDS = ((tarfile.SYMTYPE, "a symbolic link"), (tarfile.LNKTYPE, "a hard link"),
          (tarfile.CHRTYPE, "a character device"), (tarfile.BLKTYPE, "a block device"),
          (tarfile.FIFOTYPE, "a fifo"))


def size(n):
    """`2.0 GiB`: a byte count as people read it."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return "%.0f %s" % (n, unit) if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024
    return str(n)


@record
class Limits(Frozen):
    """How much one archive may unpack to: bytes of its files, and members."""
    bytes: int = MAX_BYTES
    members: int = MAX_MEMBERS

    @property
    def archive_bytes(self):
        """The most a tar.gz within these limits takes: its files' bytes (gzip adds a
        little to incompressible data), and per member its headers and padding."""
        return self.bytes + self.bytes // 256 + 4096 * self.members + (1 << 20)

    def words(self):
        """The limits as a request's words (words() and of_words() are inverses)."""
        return str(self.bytes), str(self.members)

    @classmethod
    def of_words(cls, words):
        return cls(int(words[0]), int(words[1]))


class Refused(Exception):
    """The archive as a whole is refused: past the limits (`over_limit`) or the free space,
    or not a tar.gz. The survey writes nothing: a refusal before unpacking leaves no trace."""

    def __init__(self, message, over_limit=False):
        super().__init__(message)
        self.over_limit = over_limit


class Unpacked:
    """What an unpack wrote: files and their bytes, and the members it skipped."""

    def __init__(self):
        self.files = 0
        self.bytes = 0
        self.skipped = []          # (member, why): the first SHOWN
        self.skipped_count = 0

    def skip(self, name, why):
        self.skipped_count += 1
        if len(self.skipped) < SHOWN:
            self.skipped.append((name, why))


class _Header(tarfile.TarInfo):
    """tarfile's member, refusing what tarfile would read whole into memory."""

    def _proc_member(self, tarfile_):
        if self.type in (tarfile.XGLTYPE, tarfile.GNUTYPE_SPARSE):
            raise Refused("it holds a %s header, which tfdeploy never writes" % (
                "global" if self.type == tarfile.XGLTYPE else "sparse"))
        if self.size < 0:
            raise Refused("a member's size is negative")
        if self.type in _META_TYPES:
            used = getattr(tarfile_, "_meta_used", 0) + self.size
            if used > MAX_META:
                raise Refused("a member's name and attributes take more than %s" %
                              size(MAX_META))
            tarfile_._meta_used = used
        else:
            tarfile_._meta_used = 0
        return super()._proc_member(tarfile_)

    def _sparse(self, *args):
        raise Refused("it holds a sparse member, which tfdeploy never writes")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse


# What tarfile raises on bytes that are not a tar.gz it can read.
_UNREADABLE = (tarfile.TarError, EOFError, zlib.error, ValueError, OverflowError,
               RecursionError, UnicodeError)


def _unreadable(exc):
    return Refused("not a tar.gz archive tfdeploy can read (%s)" % (
        str(exc) or type(exc).__name__))


def each_member(fileobj):
    """The archive's members in order, read as a stream (none is kept: a hostile archive's
    member list could be any length); `fileobj` must be at its start."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|gz", tarinfo=_Header) as tar:
            while True:
                member = tar.next()
                if member is None:
                    return
                del tar.members[:]
                yield tar, member
    except _UNREADABLE as exc:
        raise _unreadable(exc) from None


def survey(fileobj, limits):
    """(members, bytes) of the archive, refused (Refused) past `limits` as soon as it is
    known: a member that announces more bytes than are left is refused at its header."""
    members = total = 0
    for _, member in each_member(fileobj):
        members += 1
        total += member.size
        if members > limits.members:
            raise Refused("it holds more than %d members (the limit)" % limits.members, True)
        if total > limits.bytes:
            raise Refused("it would unpack to more than %s (the limit)" % size(limits.bytes),
                          True)
    return members, total


def unpack(fileobj, dest, limits):
    """Unpack the tar.gz `fileobj` (a seekable binary file) into the directory `dest`, made
    if missing; Refused, with nothing written, past `limits` or the free space there."""
    _, total = survey(fileobj, limits)
    os.makedirs(dest, 0o700, exist_ok=True)
    root = os.open(dest, _DIR_FLAGS)
    try:
        st = os.fstatvfs(root)
        free = st.f_bavail * st.f_frsize
        if total + ROOM_MARGIN > free:
            raise Refused("it unpacks to %s and %s has %s free" % (size(total), dest,
                                                                     size(free)))
        fileobj.seek(0)
        done = Unpacked()
        for tar, member in each_member(fileobj):
            _unpack_member(tar, member, root, done, limits)
        return done
    finally:
        os.close(root)


def _parts(name):
    """The path components of a member's name, or None for a name that is not plain."""
    name = name[:-1] if name.endswith("/") else name
    if not name or "\0" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p != "."]
    if any(p in ("", "..") for p in parts):
        return None
    return parts


def plain_name(name):
    """Whether a member's name stays inside where it is unpacked: relative, no `..`."""
    return _parts(name) is not None


def _why_not(member):
    for kind, words in _KINDS:
        if member.type == kind:
            return words
    return "a member of type %r" % member.type


def _unpack_member(tar, member, root, done, limits):
    parts = _parts(member.name)
    if parts is None:
        return done.skip(member.name, "not a plain relative name")
    if not member.isfile() and not member.isdir():
        return done.skip(member.name, _why_not(member))
    if not parts:
        if member.isfile():
            done.skip(member.name, "not a plain relative name")
        return None           # the destination itself
    try:
        folder = _walk(root, parts if member.isdir() else parts[:-1])
    except OSError as exc:
        _no_room(exc)
        return done.skip(member.name, "its folder cannot be made: %s" % exc.strerror)
    try:
        if member.isfile():
            _write(tar, member, folder, parts[-1], done, limits)
    except OSError as exc:
        _no_room(exc)
        done.skip(member.name, exc.strerror or str(exc))
    except _UNREADABLE as exc:        # the member's bytes, read here, are broken
        raise _unreadable(exc) from None
    finally:
        os.close(folder)
    return None


def _walk(root, parts):
    """A descriptor of the directory root/parts..., each made where missing; never through a
    link (ELOOP) nor a file (ENOTDIR)."""
    fd = os.dup(root)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write(tar, member, folder, name, done, limits):
    try:
        # A file already there under this name (an earlier member: in tar the last one
        # counts, or an earlier fetch) is replaced; unlinking a link removes the link.
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):
        raise OSError(errno.EISDIR, "a directory is in its place")
    fd = os.open(name, _FILE_FLAGS, (member.mode & 0o700) | 0o600, dir_fd=folder)
    with os.fdopen(fd, "wb") as out:
        source = tar.extractfile(member)
        while True:
            piece = source.read(PIECE)
            if not piece:
                break
            done.bytes += len(piece)
            if done.bytes > limits.bytes:      # the survey counted them: never, but cheap
                raise Refused("it unpacks to more than %s (the limit)" % size(limits.bytes),
                              True)
            out.write(piece)
        out.flush()
        try:
            os.utime(out.fileno(), (member.mtime, member.mtime))
        except (OverflowError, ValueError, TypeError, OSError):
            pass
    done.files += 1


def _no_room(exc):
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise Refused("no space left: %s" % exc.strerror)


def pack(folder, limits=None):
    """The folder's files as tar.gz bytes (nothing when it does not exist), or Refused when
    they are more than `limits` allow: the other side would refuse them anyway."""
    if not os.path.isdir(folder):
        return b""
    if limits is not None:
        members, total = _tree_size(folder)
        if members > limits.members or total > limits.bytes:
            raise Refused("%s holds %d files of %s: more than the limit of %s and %d files" % (
                folder, members, size(total), size(limits.bytes), limits.members), True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(folder, arcname=".")
    return buf.getvalue()


def pack_changed(folder, known, limits):
    """The regular files under `folder` by relative name, each as [size, mtime in ns], and
    tar.gz of those not as `known` lists them (each member carrying its mtime_ns, MTIME_NS):
    (b"", None) when the folder does not exist, (b"", files) when nothing changed. Refused
    past `limits`, every file counted: together they are the copy the other side keeps.
    Links are not followed."""
    if not os.path.isdir(folder):
        return b"", None
    files, buf, sent, total = {}, io.BytesIO(), 0, 0
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, names in os.walk(folder):
            dirs.sort()
            for name in sorted(names):
                rel = os.path.relpath(os.path.join(top, name), folder)
                try:
                    fd = os.open(os.path.join(top, name), _READ_FLAGS)
                except OSError:
                    continue                 # a link, or gone since the walk saw it
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    total += st.st_size
                    if len(files) >= limits.members or total > limits.bytes:
                        raise Refused("%s holds more than %s or %d files: the limit" % (
                            folder, size(limits.bytes), limits.members), True)
                    files[rel] = [st.st_size, st.st_mtime_ns]
                    if list(known.get(rel, ())) == files[rel]:
                        continue
                    info = tar.gettarinfo(arcname=rel, fileobj=f)
                    # As listed: addfile then sends exactly these bytes, or fails.
                    info.size, info.mode = st.st_size, 0o600
                    info.pax_headers = {MTIME_NS: str(st.st_mtime_ns)}
                    tar.addfile(info, f)
                    sent += 1
    return (buf.getvalue() if sent else b""), files


def listed(fileobj):
    """The archive's regular files as {name: (size, mtime_ns)} (mtime_ns None where the member
    carries none: not packed by pack_changed), and how many members it holds in all."""
    files, count = {}, 0
    for _, member in each_member(fileobj):
        count += 1
        if member.isfile():
            files[member.name] = (member.size, mtime_ns(member))
    return files, count


def mtime_ns(member):
    """The mtime_ns a member packed by pack_changed carries; None for any other."""
    ns = member.pax_headers.get(MTIME_NS, "")
    return int(ns) if ns.isdigit() else None


def pack_tails(folder, sizes, limits):
    """What each regular file under `folder` has past its size in `sizes` (by name relative to
    `folder`; a file not named there, or now shorter than named: all of it), as tar.gz of those
    pieces, and each piece's offset in its file, by name. At most `limits` a call: the rest
    comes with the next. Links are not followed; files are read as they are (a file being
    appended to gives what it has)."""
    if not os.path.isdir(folder):
        return b"", {}
    buf, offsets, total = io.BytesIO(), {}, 0
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for top, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(top, name)
                rel = os.path.relpath(path, folder)
                try:
                    fd = os.open(path, _READ_FLAGS)
                except OSError:
                    continue                 # a link, or gone since the walk saw it
                with os.fdopen(fd, "rb") as f:
                    st = os.fstat(f.fileno())
                    start = sizes.get(rel, 0)
                    start = start if 0 <= start <= st.st_size else 0
                    length = min(st.st_size - start, limits.bytes - total)
                    if not stat.S_ISREG(st.st_mode) or length <= 0 or \
                            len(offsets) >= limits.members:
                        continue
                    f.seek(start)
                    data = f.read(length)
                info = tarfile.TarInfo(rel)
                info.size, info.mode, info.mtime = len(data), 0o600, int(st.st_mtime)
                tar.addfile(info, io.BytesIO(data))
                offsets[rel], total = start, total + len(data)
    return (buf.getvalue() if offsets else b""), offsets


def _tree_size(folder):
    members = total = 0
    for top, dirs, files in os.walk(folder):
        members += len(dirs) + len(files)
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return members, total
