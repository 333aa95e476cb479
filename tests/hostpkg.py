"""The host package as the tests run it: the same zip that travels, in a run directory."""
from __future__ import annotations

import sys
from pathlib import Path

from deploy.host.layout import HOST_ZIP
from deploy.push.hostzip import host_zip


def place(rundir: Path) -> Path:
    """Put tfdeploy-host.zip into `rundir` (as the push does) and return its path."""
    path = Path(rundir) / HOST_ZIP
    if not path.exists():
        path.write_bytes(host_zip())
    return path


def command(rundir: Path) -> list[str]:
    """`python -I <rundir>/tfdeploy-host.zip`: add the verb and its arguments."""
    return [sys.executable, "-I", str(place(rundir))]
