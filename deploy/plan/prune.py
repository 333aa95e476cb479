"""The command of `inv prune` on a host, and what it keeps. Pure, like planner.py.

The host package is not on the host outside a run directory, so it travels on stdin: a tiny
bootstrap writes it to a private temporary file, imports deploy.host.prune from it and passes
the rest of stdin (what to keep, as JSON) to it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from deploy.inventory.model import Host
from deploy.plan.command import Command, HostPath

PRUNE_BOOTSTRAP = """\
import os,sys,tempfile
os.umask(0o77);i=sys.stdin.buffer;z=i.read(int(i.readline()))
f,p=tempfile.mkstemp(suffix=".zip")
with os.fdopen(f,"wb") as o:o.write(z)
sys.path.insert(0,p)
try:
 from deploy.host import prune;prune.main(sys.argv[1:],i)
finally:os.unlink(p)"""


@dataclass(frozen=True)
class Keep:
    """What no prune may free: the current payload's files and environments, and the runs the
    controller has live records of (with their environments). Environments are named by their
    requirements: which of them is a host's own, only that host knows (deploy/host/envkey.py),
    and a host sharing the workdir keeps the others' too."""
    files: frozenset[str] = frozenset()
    runs: frozenset[str] = frozenset()
    requirements: frozenset[str] = frozenset()    # sha256 of requirements.txt files

    def document(self) -> bytes:
        return json.dumps({"files": sorted(self.files), "runs": sorted(self.runs),
                           "requirements": sorted(self.requirements)}).encode()


def prune_command(host: Host, older_than: float, dry_run: bool) -> Command:
    return Command((HostPath(host.python), "-I", "-S", "-c", PRUNE_BOOTSTRAP, HostPath(host.workdir),
                    host.name, f"{older_than:g}", *(["dry"] if dry_run else [])),
                   stdin="the host package, then what to keep as JSON")
