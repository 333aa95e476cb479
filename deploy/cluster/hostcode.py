"""The host package as it travels: deploy/host/*.py, their sources in one compressed JSON
object, which each host's agent loads from memory (deploy/host/boot.py). Built once per
controller process, byte for byte the same each time, so that its hash changes only when the
code does.
"""
from __future__ import annotations

import functools
import json
import zlib
from pathlib import Path

import deploy.host

HOST_DIR = Path(deploy.host.__file__).parent


def package_files() -> dict[str, bytes]:
    """The package's modules by their path in it."""
    files = {"deploy/__init__.py": b""}
    for path in sorted(HOST_DIR.glob("*.py")):
        files[f"deploy/host/{path.name}"] = path.read_bytes()
    return files


@functools.lru_cache(maxsize=1)
def host_sources() -> bytes:
    """What boot.py's `load` reads: {path: source} as JSON, compressed."""
    sources = {name: data.decode("utf-8") for name, data in package_files().items()}
    return zlib.compress(json.dumps(sources, sort_keys=True).encode("utf-8"), 9)
