"""The one port chooser: which port each task listens on.

Hosts only report ports that are free there (deploy/host/probe.py, in the check's probe or
in the launch's own port probe); the choice is made here, the same way for both. Ports are
distinct across the whole cluster: TensorFlow binds every interface, so two hosts that are
one machine (a loopback lab, two entries for one server) must not share one.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from deploy.errors import Failure
from deploy.inventory.model import Host

# Ports asked for beyond a host's own tasks, so that ports already given to another host that
# is really the same machine can be skipped without asking again.
SPARE_PORTS = 4


class PortsUnavailable(Failure):
    pass


def ports_to_probe(host: Host) -> int:
    """How many free ports to ask a host for."""
    return host.workers + SPARE_PORTS


def choose_ports(demand: list[tuple[Host, int]],
                 free: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """`count` ports for each (host, count), in inventory order, from the ports found free on
    that host and not yet given to another. PortsUnavailable names a host that has too few."""
    taken: set[int] = set()
    chosen: dict[str, list[int]] = {}
    for host, count in demand:
        ports = [p for p in free[host.name] if p not in taken][:count]
        if len(ports) < count:
            raise PortsUnavailable(f"{host.label}: could not find {count} free ports")
        chosen[host.name] = ports
        taken.update(ports)
    return chosen


def task_ports(tasks: Iterable, chosen: Mapping[str, list[int]]) -> dict[int, int]:
    """Each host's chosen ports given to its tasks in the cluster (a plan's TaskPlans, in
    order; the evaluator listens on none): task index -> port."""
    given: dict[str, int] = {}
    ports = {}
    for task in tasks:
        if not task.in_cluster:
            continue
        slot = given[task.host.name] = given.get(task.host.name, -1) + 1
        ports[task.index] = chosen[task.host.name][slot]
    return ports
