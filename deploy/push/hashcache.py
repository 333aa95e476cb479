"""Content hashes of payload files remembered by their stat, so the next push does not read an
unchanged file again (rsync's quick check, made safer): a file counts as unchanged only when
its size, mtime, ctime and inode are all the same, and a file changed in the last few seconds
is never remembered (a write within the timestamp granularity could otherwise hide).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from deploy.host.rundir import write_atomic

CHUNK = 1 << 20
SETTLE_NS = 3_000_000_000


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class HashCache:
    def __init__(self, path: Path | None = None):
        self.path = path
        self.known: dict[str, list] = {}
        self.seen: dict[str, list] = {}
        self.changed: set[str] = set()       # abspaths of files read this time: new or changed
        if path is not None:
            try:
                doc = json.loads(path.read_text())
                self.known = doc if isinstance(doc, dict) else {}
            except (OSError, ValueError):
                pass

    def sha256(self, path: Path) -> tuple[str, os.stat_result]:
        st = path.stat()
        key = os.path.abspath(path)      # not resolve(): a realpath per file costs more than
                                         # the stat, and the key only has to be stable
        signature = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = self.known.get(key)
        if isinstance(hit, list) and hit[:4] == signature:
            self.seen[key] = hit
            return hit[4], st
        digest = file_sha256(path)
        self.changed.add(key)
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_NS:
            self.seen[key] = [*signature, digest]
        return digest, st

    def save(self) -> None:
        """Keep what this push saw (files gone from the payload drop out); best effort."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Two controllers sharing a runs directory may save at once: the last one wins.
            write_atomic(str(self.path), json.dumps(self.seen))
        except OSError:
            pass
