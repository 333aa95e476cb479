"""The commands of `inv setup` on every host. Pure, like planner.py.

An environment is named by the payload's requirements.txt and the host's Python build, machine
and libc, computed on the host by the interpreter that builds it (deploy/host/envkey.py; `inv
train`'s launch and `inv check`'s probe find it by the same function): an unchanged file
reuses it, a changed one gets a new one beside it, and so does a host whose python3 was
upgraded or that shares the workdir but runs another build. The host answers where its
environment is. Hosts that share a workdir and one environment build it once: the first takes
its lock, the others wait and reuse it (deploy/host/venv.py).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

from deploy.host.probe import unsafe_workdir
from deploy.host.layout import WHEELHOUSE, host_run_id
from deploy.inventory.model import Host, Inventory
from deploy.plan.command import Command, HostPath, Shell
from deploy.plan.planner import cleanup_command, host_agent, run_dir


# The first thing inv setup runs on a host, before it writes anything there: the workdir check
# of the push and of `inv check` (deploy/host/probe.py), by the host's python; it exits 1
# saying why an unsafe workdir is unsafe.
WORKDIR_CHECK = ("import os, pwd, stat, sys\n" + inspect.getsource(unsafe_workdir) +
                 "problem = unsafe_workdir(sys.argv[1])\nif problem:\n    sys.exit(problem)\n")


@dataclass(frozen=True)
class HostSetup:
    host: Host
    run_id: str                  # the host's own: hosts sharing a workdir build apart
    run_dir: str
    status: Command
    wheels: Command
    build: Command
    cleanup: Command


@dataclass(frozen=True)
class SetupPlan:
    run_id: str
    hosts: tuple[HostSetup, ...]


def plan_setup(inventory: Inventory, run_id: str, wheelhouse: bool) -> SetupPlan:
    """The host finds the requirements.txt the status command unpacks into the run directory,
    a directory of its own (layout.host_run_id): hosts that share a workdir each unpack, keep
    a build and clean up there. The build is told the host's name: the host that builds an
    environment others wait for names itself to them."""
    plans = []
    for host in inventory.hosts:
        own = host_run_id(run_id, host.name)
        rundir = run_dir(host, own)
        into = HostPath(rundir)
        status = host_agent(host, rundir, "envstatus")
        plans.append(HostSetup(
            host=host, run_id=own, run_dir=rundir,
            status=Command((HostPath(host.python), "-I", "-S", "-c", WORKDIR_CHECK,
                            HostPath(host.workdir), Shell("&&"), "mkdir", "-p", into,
                            Shell("&&"), "tar", "-xzf", "-", "-C", into, Shell("&&"),
                            *status.argv),
                           stdin="tar.gz of run.json, the host package and requirements.txt"),
            wheels=Command(("tar", "-xf", "-", "-C", into), stdin="tar of the wheelhouse"),
            build=host_agent(host, rundir, "setup", host.name,
                             *([WHEELHOUSE] if wheelhouse else [])),
            cleanup=cleanup_command(host, rundir, 1.0)))
    return SetupPlan(run_id, tuple(plans))

