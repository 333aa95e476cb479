"""The request of `inv prune` to a host's agent, and what it keeps. Pure, like planner.py."""
from __future__ import annotations

import json
from dataclasses import dataclass

from deploy.inventory.model import Host
from deploy.plan.command import HostPath, Request
from deploy.plan.planner import env_dir

@dataclass(frozen=True)
class Keep:
    """What no prune may free: the current payload's files and environment, and the runs the
    controller has live records of (with their environments)."""
    files: frozenset[str] = frozenset()
    runs: frozenset[str] = frozenset()
    requirements: frozenset[str] = frozenset()    # sha256 of requirements.txt files

    def document(self, host: Host) -> bytes:
        envs = sorted(env_dir(host, r).rsplit("/", 1)[1] for r in self.requirements)
        return json.dumps({"files": sorted(self.files), "runs": sorted(self.runs),
                           "envs": envs}).encode()


def prune_request(host: Host, older_than: float, dry_run: bool) -> Request:
    return Request("prune", (HostPath(host.workdir), host.name, f"{older_than:g}",
                             "dry" if dry_run else "delete"), body="what to keep, as JSON")
