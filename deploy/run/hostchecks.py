"""Run the checks of checks.py on the hosts: probe every host, then the TCP mesh between them
(mesh.py).

Nothing is written on any host: the hosts' agents run from memory. Used by `inv check` (own
connections) and by `train` before it starts anything (its session's).
"""
from __future__ import annotations

import secrets
import time
from typing import Mapping

from deploy.errors import Failure
from deploy.inventory.model import Host, Inventory
from deploy.plan.checks import (
    HOSTCHECK_SOURCE, CheckReport, HostCheck, assign_task_ports, judge_mesh, judge_probe,
    mesh_specs, probe_request, version_problems
)
from deploy.plan.planner import env_requirements
from deploy.plan.pythons import PythonNeed
from deploy.run.mesh import probe_mesh
from deploy.cluster.hostagent import HostAgent, Reply
from deploy.cluster.session import FirstAsk, Session, gather
from deploy.state.events import CheckReported, HostsChecked, Reporter
from deploy.timeline import mark

PROBE_TIMEOUT = 60.0


class ChecksFailed(Failure):
    """`inv train`'s checks found problems; nothing was started."""


def run_checks(inventory: Inventory, session: Session,
               unreachable: Mapping[str, str] | None = None,
               requirements_sha256: str | None = None,
               push_bytes: Mapping[str, int] | None = None,
               need: PythonNeed | None = None) -> CheckReport:
    """Check every host of the session's; hosts in `unreachable` (name -> why) are reported as
    such. `requirements_sha256` names the `inv setup` environment the tasks would prefer;
    `push_bytes` (by host name) what a run's push may write there, judged against its room;
    `need` the Pythons the payload's TensorFlow runs on."""
    started = time.monotonic()
    checks = [HostCheck(h) for h in inventory.hosts]
    for c in checks:
        if c.host.name not in session.agents:
            c.problems.append((unreachable or {}).get(c.host.name,
                                                      f"{c.host.label}: not connected"))
    connected = [c for c in checks if c.host.name in session.agents]
    ask = probe_asker(requirements_sha256)
    answers, errors = gather({c.host.name: session.first_replies.pop(c.host.name, None)
                              or ask(c.host, session.agents[c.host.name])
                              for c in connected}, PROBE_TIMEOUT)
    mark("probe")
    for c in connected:
        if c.host.name in errors:
            c.problems.append(str(errors[c.host.name]))
        else:
            judge_probe(c, answers[c.host.name], (push_bytes or {}).get(c.host.name, 0), need)
    probed = [c for c in connected if c.probe]
    report = CheckReport(checks, version_problems(checks))
    port_problem = assign_task_ports(probed) if probed else None
    if port_problem:
        report.problems.append(port_problem)
    elif probed:
        answers, errors = probe_mesh(probed, session.agents,
                                     mesh_specs(probed, secrets.token_hex(8)))
        judge_mesh(probed, answers, errors)
        mark("mesh")
    report.seconds = time.monotonic() - started
    return report


def probe_asker(requirements_sha256: str | None = None) -> FirstAsk:
    """The checks' probe of one host (`requirements_sha256`: the `inv setup` environment the
    tasks would prefer), asked of its agent: by run_checks, or by Session.open right behind
    the agent's start, which takes the probe off the critical path of a run's start."""
    source = HOSTCHECK_SOURCE.read_bytes()

    def ask(host: Host, agent: HostAgent) -> Reply:
        requirements = env_requirements(host, requirements_sha256)
        return agent.ask(probe_request(host, requirements), "probe",
                         source if requirements else b"")
    return ask


def check_hosts(inventory: Inventory, connect_timeout: float, accept_new_host_keys: bool,
                requirements_sha256: str | None = None,
                need: PythonNeed | None = None) -> CheckReport:
    """`inv check`: connect to every host itself, so that unreachable hosts become rows too."""
    started = time.monotonic()
    session, errors = Session.open_each(inventory.hosts, connect_timeout, accept_new_host_keys,
                                        probe_asker(requirements_sha256))
    try:
        report = run_checks(inventory, session, {n: str(e) for n, e in errors.items()},
                            requirements_sha256, need=need)
    finally:
        session.close()
    report.seconds = time.monotonic() - started
    return report


def check_before_run(session: Session, inventory: Inventory, reporter: Reporter,
                     requirements_sha256: str | None = None,
                     push_bytes: Mapping[str, int] | None = None,
                     need: PythonNeed | None = None) -> CheckReport:
    """`train`'s checks, on the session's agents. On a problem the session is closed and
    ChecksFailed raised: nothing has been started or written on any host."""
    try:
        with reporter.status(f"checking {len(inventory.hosts)} host(s)…"):
            report = run_checks(inventory, session, requirements_sha256=requirements_sha256,
                                push_bytes=push_bytes, need=need)
        if not report.ok:
            reporter.emit(CheckReported(report))
            raise ChecksFailed(f"{len(report.all_problems)} problem(s) found before starting; "
                               "nothing was started (--no-check skips the checks)")
    except BaseException:
        session.close()
        raise
    reporter.emit(HostsChecked(len(report.hosts), report.seconds))
    return report
