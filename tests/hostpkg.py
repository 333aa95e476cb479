"""The host package as the tests run it: a host's agent started locally exactly as the
controller starts one (deploy/cluster/hostagent.py over
the local transport: real processes and pipes, no network)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from deploy.host import venv
from deploy.host.archive import Limits
from deploy.host.protocol import HostRequest
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import Host
from deploy.plan.command import Request
from deploy.cluster.hostagent import HostAgent
from deploy.cluster.session import BodyFile
from deploy.transport.local import LocalTransport


def local_host(workdir: str = "~/.tfdeploy", name: str = "h") -> Host:
    return parse_inventory(
        f"hosts:\n  - {{name: {name}, transport: local, workdir: '{workdir}', "
        f"python: '{sys.executable}'}}\n", "hosts.yaml", {}).hosts[0]


@dataclass(frozen=True)
class Unchecked(HostRequest):
    """A request as a broken or foreign controller may send it: any verb, any fields."""
    raw_verb: str
    raw: dict = field(default_factory=dict)

    @property
    def verb(self):
        return self.raw_verb

    def fields(self):
        return self.raw


class LocalAgent:
    """A host's agent on this machine; ask() sends a request and waits for its answer
    (StepFailed when the host answers with an error)."""

    def __init__(self, host: Host | None = None):
        self.host = host or local_host()
        self.transport = LocalTransport(self.host)
        self.agent = HostAgent(self.host, self.transport)

    def ask(self, request: HostRequest, body: bytes = b"", timeout: float = 30, **env: str):
        """`request`'s answer; `env`: the launch's environment."""
        return self.agent.ask(Request(request), request.verb, body, **env).wait(timeout)

    def close(self) -> None:
        self.agent.close()

    def __enter__(self) -> "LocalAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fetched(agent: HostAgent, request: Request, folder: Path, limits: Limits = Limits()) -> bytes:
    """The archive that answers a tar-out `request` (b"" when none came), by way of a file in
    `folder`, as the controller takes it."""
    with BodyFile(folder, limits) as spool:
        agent.ask(request, "fetch", into=spool).wait(30)
        archive = spool.ready(agent.host.label, "fetch")
        return archive.read() if archive is not None else b""


def fake_env(root: Path, want: dict) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / venv.MARKER).write_text(json.dumps(want))
    return root
