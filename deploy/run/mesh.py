"""The TCP mesh probe of `inv check`, in three phases the controller drives on every host at
once: listen (every host opens its task ports and says so), dial (every host reaches every
peer's ports, a bounded number at a time), close. No host dials before every host listens,
however long starting the probes over SSH takes with many hosts; each phase costs one round
trip per host, all hosts in parallel, so the probe's cost grows with the number of hosts, not
with its square. Each host's probe ends by its own deadline whatever the controller does
(deploy/host/check.py mesh).
"""
from __future__ import annotations

import json
from typing import Mapping

from deploy.plan.checks import MESH_DEADLINE, HostCheck, mesh_command, mesh_stdin
from deploy.ssh.parallel import on_each
from deploy.ssh.session import StepFailed, agent_json
from deploy.ssh.transport import Exchange, Transport

# The controller waits for a phase's answer this long beyond the hosts' own deadline.
SLACK = 10.0


def phase_answer(exchange: Exchange, check: HostCheck, phase: str) -> dict:
    """The probe's JSON line for `phase`; when it ended instead, why (its exit and stderr)."""
    line = exchange.readline()
    try:
        doc = json.loads(line) if line.endswith(b"\n") else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and phase in doc:
        return doc
    result = exchange.finish()
    if result.code in (126, 127):       # the shell could not run the interpreter at all
        raise StepFailed(f"{check.host.label}: python {check.host.python!r} does not run there: "
                         f"{result.error_text()} (set 'python:' in the inventory)")
    raise StepFailed(f"{check.host.label}: mesh check ({phase}): "
                     f"{result.error_text() if result.code else repr(line[:200])}")


def probe_mesh(checks: list[HostCheck], transports: Mapping[str, Transport], source: bytes,
               specs: Mapping[str, dict]) -> tuple[dict[str, dict], dict[str, str]]:
    """Every host's mesh answer (for judge_mesh), and the hosts whose probe failed (why)."""
    by_name = {c.host.name: c for c in checks}
    exchanges: dict[str, Exchange] = {}
    errors: dict[str, str] = {}

    def listen(c: HostCheck) -> None:
        exchange = transports[c.host.name].exchange(
            mesh_command(c.host, specs[c.host.name]).line, timeout=MESH_DEADLINE + SLACK)
        exchanges[c.host.name] = exchange
        exchange.send(mesh_stdin(source))
        phase_answer(exchange, c, "listening")

    def dial(name: str) -> None:
        exchanges[name].send(b"dial\n")
        phase_answer(exchanges[name], by_name[name], "dialed")

    def close(name: str) -> dict:
        exchanges[name].send(b"close\n")
        return agent_json(exchanges[name].finish(), by_name[name].host, "mesh check")

    def phase(names, step):
        results, failed = on_each(names, str, step)
        errors.update({name: str(error) for name, error in failed.items()})
        return [name for name in names if name not in failed], results

    try:
        listening, _ = phase([c.host.name for c in checks], lambda n: listen(by_name[n]))
        dialed, _ = phase(listening, dial)
        _, answers = phase(dialed, close)
    finally:
        for exchange in exchanges.values():
            exchange.close()
    return answers, errors
