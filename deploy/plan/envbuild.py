"""The steps of `inv setup` on every host. Pure, like planner.py.

An environment is named by the payload's requirements.txt and the host's Python build, machine
and libc, computed on the host by the interpreter that builds it (deploy/host/envkey.py; `inv
train`'s launch and `inv check`'s probe find it by the same function): an unchanged file
reuses it, a changed one gets a new one beside it, and so does a host whose python3 was
upgraded or that shares the workdir but runs another build. The host answers where its
environment is. Hosts that share a workdir and one environment build it once: the first takes
its lock, the others wait and reuse it (deploy/host/venv.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from deploy.host.layout import host_run_id
from deploy.host.protocol import EnvBuildRequest, EnvStatusRequest
from deploy.inventory.model import Host, Inventory
from deploy.plan.command import Command, HostPath, Request
from deploy.plan.planner import cleanup_request, run_dir


@dataclass(frozen=True)
class HostSetup:
    host: Host
    run_id: str                  # the host's own: hosts sharing a workdir build apart
    run_dir: str
    status: Request
    wheels: Command
    build: Request
    cleanup: Request


@dataclass(frozen=True)
class SetupPlan:
    run_id: str
    hosts: tuple[HostSetup, ...]


def plan_setup(inventory: Inventory, run_id: str, wheelhouse: bool) -> SetupPlan:
    """Every step is a request to the host's agent but the wheelhouse, which `tar` unpacks as
    it streams. The status request's stage (run.json and requirements.txt) is unpacked, after
    the workdir check, into a run directory of the host's own (layout.host_run_id): hosts that
    share a workdir each unpack, keep a build and clean up there. The build is told the host's
    name: the host that builds an environment others wait for names itself to them."""
    plans = []
    for host in inventory.hosts:
        own = host_run_id(run_id, host.name)
        rundir = run_dir(host, own)
        plans.append(HostSetup(
            host=host, run_id=own, run_dir=rundir,
            status=Request(EnvStatusRequest(HostPath(rundir)),
                           body="tar.gz of run.json and requirements.txt"),
            wheels=Command(("tar", "-xf", "-", "-C", HostPath(rundir)),
                           stdin="tar of the wheelhouse"),
            build=Request(EnvBuildRequest(HostPath(rundir), host.name, wheelhouse)),
            cleanup=cleanup_request(host, rundir, 1.0)))
    return SetupPlan(run_id, tuple(plans))
