"""What travels to every host, in two parts.

The stage: a small tar.gz with the run's identity, the host package and the payload's manifest
(relative path -> sha256, mode, size). The host answers which hashes its content cache lacks.
The files: one stream of exactly those contents, each headed by its hash and size, on the same
stdin after the host's answer; the host verifies and caches them, then assembles payload/ from
its cache (deploy/host/cache.py).
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from deploy.errors import BadInput
from deploy.host.cache import END, MAGIC
from deploy.host.layout import INLINE, MANIFEST, RUN_FILE
from deploy.push.hashcache import HashCache
from deploy.push.ignore import IGNORE_FILE, IgnoreRules


class BundleError(BadInput):
    pass


@dataclass(frozen=True)
class FileEntry:
    path: str            # relative, POSIX
    sha256: str
    mode: int            # 0o755 or 0o644: only the executable bit travels
    size: int


# Names that are tfdeploy's own wherever they are in a payload (a controller's scratch files),
# but for the payload's own ignore file.
OURS_PREFIX = ".tfdeploy"


def ours(name: str) -> bool:
    return name.startswith(OURS_PREFIX) and name != IGNORE_FILE


def left_out_of(payload: Path, runs_dir: Path | None) -> list[Path]:
    """What of tfdeploy's own lies in the payload and never travels: the runs directory (its
    records, logs and fetched models: `--payload .` with the default `--runs-dir runs`), and
    `.tfdeploy*` at its top."""
    found = [p for p in sorted(payload.glob(OURS_PREFIX + "*")) if ours(p.name)]
    if runs_dir is not None and runs_dir.is_dir() and runs_dir.resolve() != payload.resolve() \
            and _inside(runs_dir.resolve(), payload.resolve()):
        found.append(runs_dir)
    return found


def payload_files(payload: Path, rules: IgnoreRules | None = None,
                  what: str = "payload", left_out: list[Path] = ()) -> list[Path]:
    """Regular files of the payload that are not ignored, symlinks inside it followed (hosts
    get their content); a symlink leaving the payload is refused unless it is ignored.
    `what` names the directory in errors (the payload, or a data directory). `left_out`:
    paths inside it that never travel (left_out_of), and neither does `.tfdeploy*`."""
    rules = rules or IgnoreRules.of_payload(payload)
    root = payload.resolve()
    skipped = {p.resolve() for p in left_out}
    files = []

    def unreadable(error: OSError) -> None:
        raise BundleError(f"{error.filename}: cannot read this directory of the {what}: "
                          f"{error.strerror}")
    for dirpath, dirnames, filenames in os.walk(payload, followlinks=True, onerror=unreadable):
        here = Path(dirpath)
        rel_here = "" if here == payload else here.relative_to(payload).as_posix() + "/"
        dirnames[:] = sorted(d for d in dirnames if not rules.ignored(rel_here + d, True)
                             and not ours(d)
                             and (here / d).resolve() not in skipped)
        kept = sorted(f for f in filenames if not rules.ignored(rel_here + f, False)
                      and not ours(f))
        for name in [*dirnames, *kept]:
            path = here / name
            if path.is_symlink() and not _inside(path.resolve(), root):
                raise BundleError(f"{path}: symlink points outside the {what} ({path.resolve()})")
        if here != payload and here.is_symlink() and _inside(root, here.resolve()):
            raise BundleError(f"{here}: symlink loops back into the {what}")
        for name in kept:
            path = here / name
            if path.is_file():
                if not os.access(path, os.R_OK):
                    raise BundleError(f"{path}: cannot read this file of the {what} "
                                      "(permission denied); fix it or list it in "
                                      f"{payload / IGNORE_FILE}")
                files.append(path.relative_to(payload))
    return sorted(files)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def file_entry(payload: Path, rel: Path, hashes: HashCache) -> FileEntry:
    try:
        digest, stat = hashes.sha256(payload / rel)
    except OSError as exc:
        raise BundleError(f"{payload / rel}: cannot read: {exc.strerror or exc}") from None
    return FileEntry(rel.as_posix(), digest, 0o755 if stat.st_mode & 0o100 else 0o644,
                     stat.st_size)


def checked_payload(payload: Path, entry: str, runs_dir: Path | None = None) -> list[Path]:
    """The payload's files that travel (payload_files; never the runs directory `runs_dir`),
    after checking what a push needs of the payload directory, the entry script and the
    ignore file. A dry run and a real run both check through here, so that a dry run that
    passes means the push will not refuse."""
    if not payload.is_dir():
        kind = "" if not payload.exists() else (
            f" ({payload} is a file)" if payload.is_file() else f" ({payload} is not a directory)")
        raise BundleError(f"payload directory {payload} does not exist{kind}: give the "
                          "directory to push with --payload")
    if not os.access(payload, os.R_OK | os.X_OK):
        raise BundleError(f"payload directory {payload} cannot be read (permission denied)")
    if not entry or "\0" in entry or os.path.isabs(entry):
        raise BundleError(f"entry script {entry!r}: give a path relative to the payload "
                          f"{payload}, such as train.py")
    entry_path = payload / entry
    if not _inside(entry_path.resolve(), payload.resolve()):
        raise BundleError(f"entry script {entry!r} is outside the payload {payload}: only the "
                          "payload travels, so the entry must be inside it")
    if entry_path.is_dir():
        raise BundleError(f"entry script {entry!r} not found in payload {payload}: it is a "
                          "directory, not a script")
    if not entry_path.is_file():
        scripts = sorted(p.name for p in payload.glob("*.py") if p.is_file())
        there = (f"its scripts: {', '.join(scripts[:10])}{' …' if len(scripts) > 10 else ''}"
                 if scripts else "it has no .py file at its top")
        raise BundleError(f"entry script {entry!r} not found in payload {payload} ({there}): "
                          f"name the script to run with --entry")
    files = payload_files(payload, left_out=left_out_of(payload, runs_dir))
    entry_rel = os.path.normpath(entry)
    if not any(f.as_posix() == entry_rel for f in files) and not any(
            (payload / f).resolve() == entry_path.resolve() for f in files):
        raise BundleError(f"entry script {entry!r} is excluded by {payload / IGNORE_FILE}")
    return files


def manifest(payload: Path, entry: str, hashes: HashCache | None = None,
             walked: list[Path] | None = None) -> tuple[FileEntry, ...]:
    """Every file that travels, with its content hash. Checks the payload and the entry,
    unless `walked` gives the files checked_payload already found."""
    hashes = hashes or HashCache()
    if walked is None:
        walked = checked_payload(payload, entry)
    return tuple(file_entry(payload, rel, hashes) for rel in walked)


def manifest_document(files: tuple[FileEntry, ...]) -> dict:
    return {"files": [[f.path, f.sha256, f.mode, f.size] for f in files]}


def stage_tar(run_id: str, files: tuple[FileEntry, ...], riders: list[FileEntry] = (),
              payload: Path | None = None) -> bytes:
    """run.json, the manifest and the content of `riders` (as
    inline/<sha256>, taken from `payload`), as a small tar.gz."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        add_bytes(tar, RUN_FILE, json.dumps({"run_id": run_id}).encode())
        add_bytes(tar, MANIFEST, json.dumps(manifest_document(files)).encode())
        for f in riders:
            add_bytes(tar, f"{INLINE}/{f.sha256}", (payload / f.path).read_bytes())
    return buf.getvalue()


# Content a faster host has read is kept for the hosts behind it up to this much; past it,
# those read the file again (from the page cache, most likely) instead of the controller
# holding a whole dataset in memory.
SHARED_BYTES = 256 << 20


class FileStream:
    """The content of every file whose hash is in `wanted`, once per hash, framed as
    deploy/host/cache.py reads it: MAGIC, then per file a line "<sha256> <size>" and its bytes, END.
    Iterating gives the pieces in order without joining them. Hosts iterate the same stream
    at their own pace from their own threads: a file read for the first of them is kept
    until every host that is iterating has passed it (within SHARED_BYTES), so hosts that
    keep up read each file from disk once between them, and memory holds only the distance
    between the fastest and the slowest. Not compressed: payloads that matter for speed are
    mostly data and weights. A file changed since it was hashed is caught here (or by the
    host's check)."""

    def __init__(self, payload: Path, files: tuple[FileEntry, ...], wanted: set[str]):
        self.payload = payload
        self.order: list[FileEntry] = []
        seen: set[str] = set()
        for f in files:
            if f.sha256 in wanted and f.sha256 not in seen:
                seen.add(f.sha256)
                self.order.append(f)
        missing = wanted - seen
        if missing:
            raise BundleError(f"the host asked for content not in the payload: "
                              f"{sorted(missing)[:3]}")
        self.size = sum(f.size for f in self.order)
        self._kept: dict[int, bytes] = {}
        self._kept_bytes = 0
        self._next: dict[object, int] = {}       # per iteration: the next file it reads
        self._lock = threading.Lock()

    def _content(self, i: int) -> bytes:
        with self._lock:
            data = self._kept.get(i)
            if data is None:
                f = self.order[i]
                data = (self.payload / f.path).read_bytes()
                if len(data) != f.size:
                    raise BundleError(f"{self.payload / f.path} changed while it was being pushed")
                if self._kept_bytes + len(data) <= SHARED_BYTES:
                    self._kept[i] = data
                    self._kept_bytes += len(data)
            return data

    def _passed(self, reader: object, i: int | None) -> None:
        """`reader` is now at file `i` (None: it ended); drop what no reader still needs."""
        with self._lock:
            if i is None:
                self._next.pop(reader, None)
            else:
                self._next[reader] = i
            slowest = min(self._next.values(), default=len(self.order))
            for k in [k for k in self._kept if k < slowest]:
                self._kept_bytes -= len(self._kept.pop(k))

    def __iter__(self) -> Iterator[bytes]:
        reader = object()
        self._passed(reader, 0)
        try:
            yield MAGIC
            for i, f in enumerate(self.order):
                yield f"{f.sha256} {f.size}\n".encode()
                yield self._content(i)
                self._passed(reader, i + 1)
            yield END
        finally:
            self._passed(reader, None)


class SharedStreams:
    """One FileStream per directory and set of wanted hashes: hosts that lack the same files
    share it, and sending starts with the first file, not after all of them were read."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, frozenset[str]], FileStream] = {}
        self._lock = threading.Lock()

    def get(self, root: Path, files: tuple[FileEntry, ...], wanted: frozenset[str]) -> FileStream:
        key = (str(root), wanted)
        with self._lock:
            if key not in self._streams:
                self._streams[key] = FileStream(root, files, set(wanted))
            return self._streams[key]


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600        # the user's alone, also where a tar as root keeps modes (setup)
    tar.addfile(info, io.BytesIO(data))
