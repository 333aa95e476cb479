"""The commands of `inv setup` on every host. Pure, like planner.py, whose env_dir() says
where each environment lives (so `inv train` finds it by the same computation).

An environment is keyed by the payload's requirements.txt and the host's base Python command,
so an unchanged file reuses it and a changed one gets a new one beside it. The Python *version*
is checked on the host (tfdeploy-env.json): a host whose python3 was upgraded rebuilds in place
of the old one.
"""
from __future__ import annotations

from dataclasses import dataclass

from deploy.host.layout import WHEELHOUSE
from deploy.inventory.model import Host, Inventory
from deploy.plan.command import Command, HostPath, Shell
from deploy.plan.planner import cleanup_command, env_dir, host_agent, run_dir


@dataclass(frozen=True)
class HostSetup:
    host: Host
    run_dir: str
    env_dir: str
    status: Command
    wheels: Command
    build: Command
    cleanup: Command


@dataclass(frozen=True)
class SetupPlan:
    run_id: str
    hosts: tuple[HostSetup, ...]


def plan_setup(inventory: Inventory, requirements_sha256: str, run_id: str,
               wheelhouse: bool) -> SetupPlan:
    plans = []
    for host in inventory.hosts:
        rundir = run_dir(host, run_id)
        envdir = env_dir(host, requirements_sha256)
        into = HostPath(rundir)
        status = host_agent(host, rundir, "envstatus", HostPath(envdir))
        plans.append(HostSetup(
            host=host, run_dir=rundir, env_dir=envdir,
            status=Command(("mkdir", "-p", into, Shell("&&"), "tar", "-xzf", "-", "-C", into,
                            Shell("&&"), *status.argv),
                           stdin="tar.gz of run.json, the host package and requirements.txt"),
            wheels=Command(("tar", "-xf", "-", "-C", into), stdin="tar of the wheelhouse"),
            build=host_agent(host, rundir, "setup", HostPath(envdir),
                             *([WHEELHOUSE] if wheelhouse else [])),
            cleanup=cleanup_command(host, rundir, 1.0)))
    return SetupPlan(run_id, tuple(plans))

