"""GPUs chosen by the hosts when a run starts, before anything of it is written anywhere.

A host whose inventory lists GPUs (`gpus: [0, 1]`), asks for N free ones (`gpus: 2`) or for
every free one (`gpus: free`) places its tasks itself, from what its `nvidia-smi` says and the
leases of the runs before (deploy/host/gpus.py), and leases the GPUs it gives them; two runs
started at the same moment thus never get one GPU. A host that cannot (a listed GPU busy, too
few free) refuses the run, naming the GPU, who holds it and how many are free: the leases
taken elsewhere are let go and nothing else happens. `gpus: all` places nothing.
"""
from __future__ import annotations

import dataclasses

from deploy.errors import Failure
from deploy.inventory.model import Inventory
from deploy.plan.planner import gpu_place_request, gpu_release_request
from deploy.cluster.session import Session, gather
from deploy.state.events import GpusPlaced, Reporter

TIMEOUT = 60.0


class GpusRefused(Failure):
    """A host could not give the run the GPUs its inventory asks for; nothing was started."""


def place_gpus(inventory: Inventory, session: Session, run_id: str, allow_busy: bool,
               reporter: Reporter) -> Inventory:
    """The inventory with each placing host's GPUs as the list its tasks got (one task per
    GPU); GpusRefused when any host refused."""
    placing = [h for h in inventory.hosts if h.gpus is not None and h.gpus != "all"]
    if not placing:
        return inventory
    with reporter.status(f"placing tasks on GPUs on {len(placing)} host(s)…"):
        replies = {h.name: session.agents[h.name].ask(gpu_place_request(h, run_id, allow_busy),
                                                      "placing GPUs") for h in placing}
        answers, errors = gather(replies, TIMEOUT)
    problems = [str(error) for error in errors.values()]
    problems += [f"{h.label}: {answers[h.name].problem}" for h in placing
                 if h.name in answers and answers[h.name].problem]
    if problems:
        leased = [h.name for h in placing if h.name in answers and answers[h.name].indices]
        gather({name: session.agents[name].ask(gpu_release_request(run_id), "releasing GPUs")
                for name in leased}, TIMEOUT)
        raise GpusRefused("GPUs refused the run; nothing was started:\n" +
                          "\n".join(f"  - {p}" for p in problems))
    placed = {h.name: answers[h.name].indices for h in placing}
    reporter.emit(GpusPlaced(tuple((name, indices) for name, indices in placed.items())))
    return dataclasses.replace(inventory, hosts=tuple(
        dataclasses.replace(h, gpus=tuple(placed[h.name]), workers=len(placed[h.name]))
        if h.name in placed else h for h in inventory.hosts))
