"""The TCP mesh probe of `inv check`, in three phases the controller drives on every host at
once: listen (every host opens its task ports and says so), dial (every host reaches every
peer's ports, a bounded number at a time), close. No host dials before every host listens,
however long starting the agents over SSH takes with many hosts; each phase costs one round
trip per host, all hosts in parallel, so the probe's cost grows with the number of hosts, not
with its square. Each host's probe ends by its own deadline whatever the controller does
(deploy/host/probe.py mesh).
"""
from __future__ import annotations

from typing import Mapping

from deploy.plan.checks import MESH_DEADLINE, HostCheck, mesh_requests
from deploy.cluster.hostagent import HostAgent
from deploy.cluster.session import gather

# The controller waits for a phase's answer this long beyond the hosts' own deadline.
SLACK = 10.0


def probe_mesh(checks: list[HostCheck], agents: Mapping[str, HostAgent],
               specs: Mapping[str, dict]) -> tuple[dict[str, dict], dict[str, str]]:
    """Every host's mesh answer (for judge_mesh), and the hosts whose probe failed (why)."""
    requests = {c.host.name: mesh_requests(specs[c.host.name]) for c in checks}
    errors: dict[str, str] = {}
    timeout = MESH_DEADLINE + SLACK

    def phase(names: list[str], index: int, step: str) -> tuple[list[str], dict[str, dict]]:
        answers, failed = gather({name: agents[name].ask(requests[name][index], step)
                                  for name in names}, timeout)
        errors.update({name: str(error) for name, error in failed.items()})
        return [name for name in names if name not in failed], answers

    listening, _ = phase([c.host.name for c in checks], 0, "mesh check (listening)")
    dialed, _ = phase(listening, 1, "mesh check (dialing)")
    # A host that failed a phase still has its probe open: closing it frees its ports now
    # rather than at its deadline.
    for name in set(listening) - set(dialed):
        agents[name].ask(requests[name][2], "mesh check")
    _, answers = phase(dialed, 2, "mesh check")
    return answers, errors
