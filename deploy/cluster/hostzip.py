"""The host package as it travels: deploy/host/*.py, as one zip placed in each run directory,
where the tasks' supervisors and `inv setup`'s steps run it as `python -I
<rundir>/tfdeploy-host.zip VERB ...` (deploy/host/main.py has those verbs), and as their sources
in one compressed JSON object, which each host's agent loads from memory (deploy/host/boot.py).
Each is built once per controller process, byte for byte the same each time (the zip's dates
fixed), so that its hash changes only when the code does.
"""
from __future__ import annotations

import functools
import io
import json
import zipfile
import zlib
from pathlib import Path

import deploy.host

HOST_DIR = Path(deploy.host.__file__).parent
# The zip's entry point; everything else is the package itself, under its own name.
ZIP_MAIN = b"import sys\n\nfrom deploy.host.main import main\n\nmain(sys.argv[1:])\n"


def package_files() -> dict[str, bytes]:
    """The package's modules by their path in it."""
    files = {"deploy/__init__.py": b""}
    for path in sorted(HOST_DIR.glob("*.py")):
        files[f"deploy/host/{path.name}"] = path.read_bytes()
    return files


@functools.lru_cache(maxsize=1)
def host_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        def add(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
        add("__main__.py", ZIP_MAIN)
        for name, data in package_files().items():
            add(name, data)
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def host_sources() -> bytes:
    """What boot.py's `load` reads: {path: source} as JSON, compressed."""
    sources = {name: data.decode("utf-8") for name, data in package_files().items()}
    return zlib.compress(json.dumps(sources, sort_keys=True).encode("utf-8"), 9)
