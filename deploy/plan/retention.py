"""The request of `inv prune` to a host's agent, and what it keeps. Pure, like planner.py."""
from __future__ import annotations

import json
from dataclasses import dataclass

from deploy.host.protocol import PruneRequest
from deploy.inventory.model import Host
from deploy.plan.command import HostPath, Request


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


def prune_request(host: Host, older_than: float, dry_run: bool) -> Request:
    return Request(PruneRequest(HostPath(host.workdir), host.name, older_than, dry_run),
                   body="what to keep, as JSON")
