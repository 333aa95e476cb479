"""Files every login reads, parsed once per controller process: the hosts of a run log in
with the same known_hosts and key files. A file is read at each use (a few kilobytes) and
parsed again only when its bytes have changed (a key accepted meanwhile, a line edited, a key
file replaced): their digest decides, not the file's size or time, and it is all that is kept
of them (a private key file's bytes are not).
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


class ParsedFiles(Generic[T]):
    """`parse(path, data, *how)` per file and `how`, kept while the file's bytes stay the
    same. One parse at a time: the logins of a run start together, and the others wait for the
    first one's result rather than parse the same bytes beside it. A parse that raises keeps
    nothing."""

    def __init__(self, parse: Callable[..., T]):
        self._parse = parse
        self._kept: dict[tuple, tuple[bytes, T]] = {}
        self._lock = threading.Lock()

    def get(self, path: str, *how: Hashable) -> T:
        """The parsed file; OSError where it cannot be read."""
        data = Path(path).read_bytes()
        key, digest = (path, *how), hashlib.sha256(data).digest()
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept[0] != digest:
                kept = self._kept[key] = (digest, self._parse(path, data, *how))
        return kept[1]
