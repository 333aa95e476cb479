"""The host package as it travels: deploy/host/*.py in one zip, loaded from memory by each
host's agent (deploy/host/boot.py), and placed in each run directory, where the tasks'
supervisors and `inv setup`'s steps run it as `python -I <rundir>/tfdeploy-host.zip VERB ...`
(deploy/host/main.py has those verbs). The zip is built once per controller process, byte for
byte the same each time (fixed dates), so that its hash changes only when the code does.
"""
from __future__ import annotations

import functools
import io
import zipfile
from pathlib import Path

import deploy.host

HOST_DIR = Path(deploy.host.__file__).parent
# The zip's entry point; everything else is the package itself, under its own name.
ZIP_MAIN = b"import sys\n\nfrom deploy.host.main import main\n\nmain(sys.argv[1:])\n"


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
        add("deploy/__init__.py", b"")
        for path in sorted(HOST_DIR.glob("*.py")):
            add(f"deploy/host/{path.name}", path.read_bytes())
    return buf.getvalue()
