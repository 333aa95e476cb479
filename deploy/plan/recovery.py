"""A run that lost hosts (--restarts): the inventory its next attempt runs on. Pure: the
controller (run/restarts.py) stops what answers, carries the kept backup and launches the
plan made from this inventory.

Each lost host that ran tasks hands them to a spare (`role: spare`, not lost itself), which
takes the lost host's place in the order of hosts, so every task keeps its type and index
(TF_CONFIG is rebuilt with the spare's address and new ports). With no spare left and
--shrink, the lost host's tasks are dropped and the others renumbered: fewer workers, the
first remaining one the chief. A lost host stays in the inventory as a spare that is never
chosen again (the controller knows it lost), so that the run's record keeps it and `inv
down` can clean it once it answers again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Collection

from deploy.errors import Failure
from deploy.inventory.model import SPARE, Inventory


class NoRecovery(Failure):
    """The lost hosts' tasks cannot be placed: the run ends."""


@dataclass(frozen=True)
class Recovery:
    inventory: Inventory
    moved: tuple[tuple[str, str], ...] = ()     # (lost host, the spare that takes its tasks)
    dropped: tuple[str, ...] = ()               # lost hosts whose tasks are given up (--shrink)

    def shown(self) -> str:
        parts = [f"{spare} takes the tasks of {lost}" for lost, spare in self.moved]
        if self.dropped:
            workers = self.inventory.task_count
            parts.append(f"going on without {', '.join(self.dropped)}: {workers} worker(s) on "
                         + ", ".join(h.name for h in self.inventory.hosts if h.tasks))
        return "; ".join(parts)


def recovered(inventory: Inventory, lost: Collection[str], shrink: bool = False,
              min_workers: int = 1) -> Recovery:
    """The inventory without the lost hosts' tasks on them; NoRecovery saying why there is
    none. `lost`: every host given up on in this run (earlier losses included)."""
    hosts = list(inventory.hosts)
    spares = [h for h in hosts if h.role == SPARE and h.name not in lost]
    moved, dropped = [], []
    for i, host in enumerate(hosts):
        if host.name not in lost or not host.tasks:
            continue
        if spares:
            spare = spares.pop(0)
            j = hosts.index(spare)
            hosts[i] = dataclasses.replace(spare, role=host.role, workers=host.workers)
            hosts[j] = dataclasses.replace(host, role=SPARE)
            moved.append((host.name, spare.name))
        elif shrink:
            hosts[i] = dataclasses.replace(host, role=SPARE)
            dropped.append(host.name)
        else:
            raise NoRecovery(f"{host.name} is lost and no spare is left to take its tasks "
                             "(--shrink goes on with the hosts that remain)")
    result = Inventory(path=inventory.path, hosts=tuple(hosts))
    if dropped and result.task_count < min_workers:
        raise NoRecovery(f"without {', '.join(dropped)} {result.task_count} worker(s) would "
                         f"remain, fewer than --min-workers {min_workers}")
    if not result.task_count:
        raise NoRecovery("no host with tasks is left")
    return Recovery(result, tuple(moved), tuple(dropped))
