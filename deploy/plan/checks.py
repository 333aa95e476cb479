"""What `inv check` asks each host and how it judges the answers. Pure: no network, no clock;
deploy/run/hostchecks.py runs it. Every problem is a sentence that names the host and what to do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import deploy.host.probe
from deploy.host.archive import size
from deploy.host.gpus import busy_reason
from deploy.host.probe import PACKAGES
from deploy.host.protocol import (
    Connect, MeshCloseRequest, MeshDialRequest, MeshListenRequest, MeshResult, Probe, ProbeRequest
)
from deploy.host.records import asdict
from deploy.inventory.model import Host
from deploy.plan.command import HostPath, Request
from deploy.plan.ports import PortsUnavailable, choose_ports, ports_to_probe
from deploy.plan.pythons import PythonNeed, install_hint, python_problem

HOSTCHECK_SOURCE = Path(deploy.host.probe.__file__)
# A run needs room for the payload, logs and the chief's output; below this it is likely to
# fail half-way, after the cluster has started.
MIN_DISK_FREE = 512 * 1024 ** 2
# What a push needs beyond the bytes it writes: a tenth more for the filesystem's own
# accounting (every file takes whole blocks, a directory takes blocks too) and for what grows
# from the first second (the tasks' logs, the chief's first checkpoints), plus 64 MiB for the
# run directory's stage (host package, manifest, files that ride along) and the filesystem's
# reserve. A push that just fits would leave the tasks failing on their first write.
PUSH_MARGIN_FRACTION = 0.10
PUSH_MARGIN_BYTES = 64 * 1024 ** 2
# A port is tried this long at most; a blocked port costs this much time, a healthy mesh far less.
MESH_WINDOW = 5.0
# The whole mesh probe on a host, its three phases (listen, dial, close) together, ends by
# then whatever the controller does: long enough for many hosts to start their probes.
MESH_DEADLINE = 120.0
MESH_ATTEMPT = 2.0     # one connection attempt; a firewall that drops packets times out here


@dataclass
class HostCheck:
    """Everything learned about one host; `problems` are filled by the judge_* functions."""
    host: Host
    probe: Probe | None = None         # None: not connected, or its python did not run
    ports: list[int] = field(default_factory=list)   # one per task, as a run would get them
    mesh_in: tuple[int, int] = (0, 0)  # connections to this host's ports: (answered, tried)
    mesh_out: tuple[int, int] = (0, 0)
    problems: list[str] = field(default_factory=list)


@dataclass
class CheckReport:
    hosts: list[HostCheck]
    problems: list[str] = field(default_factory=list)   # about the cluster as a whole
    seconds: float = 0.0

    @property
    def all_problems(self) -> list[str]:
        return [p for h in self.hosts for p in h.problems] + self.problems

    @property
    def ok(self) -> bool:
        return not self.all_problems

    @property
    def host_ports(self) -> dict[str, list[int]]:
        """Each host's task ports, chosen as a run chooses them and, once the mesh passed,
        proven reachable from every other host."""
        return {c.host.name: c.ports for c in self.hosts}


def tf_label(host: Host) -> str:
    return f"{host.name} ({host.tf_address})"


def probe_request(host: Host, env_requirements: str | None = None) -> Request:
    """The probe, asked of the host's agent. With `env_requirements` (the environment of `inv
    setup` for that requirements.txt), that environment's python answers where it exists on
    the host (its name is the host's to compute, deploy/host/envkey.py), since it is what the
    tasks will run; it reads deploy/host/probe.py, which comes with the request."""
    data = HostPath(host.data.path) if host.data is not None and host.data.kind == "remote" \
        else None                                # tasks will read it: can they?
    return Request(ProbeRequest(HostPath(host.workdir), ports_to_probe(host), data,
                                env_requirements),
                   body="deploy/host/probe.py, for the environment's python"
                   if env_requirements else "")


def mesh_requests(spec: dict) -> tuple[Request, Request, Request]:
    """The mesh probe's phases on one host: listen (with its SPEC), dial, close."""
    return (Request(MeshListenRequest(**spec)), Request(MeshDialRequest()),
            Request(MeshCloseRequest()))


def push_needs(push_bytes: int) -> int:
    """The free bytes a push of `push_bytes` new bytes needs on its host, margin included."""
    return int(push_bytes * (1 + PUSH_MARGIN_FRACTION)) + PUSH_MARGIN_BYTES


def room_problem(label: str, free: int, where: str, push_bytes: int) -> str | None:
    """`h3: 28.0 MiB free in /path, this push needs 60.0 MiB (...)`, or None when there is
    room. Used with the probe's answer (an upper bound: every byte counted, cached or not) and
    again with the host's answer to a push (exactly the files its cache lacks)."""
    needs = push_needs(push_bytes)
    if free >= needs:
        return None
    return (f"{label}: {size(free)} free in {where}, this push needs {size(push_bytes)} "
            f"({size(needs)} with the margin for logs and output)")


def judge_probe(check: HostCheck, answer: Probe, push_bytes: int = 0,
                need: PythonNeed | None = None) -> None:
    """`push_bytes`: what the run's push may write to this host (payload and data, cached or
    not); 0 when there is no push (`inv check`). `need`: the Pythons the payload's TensorFlow
    runs on (pythons.py)."""
    host, label = check.host, check.host.label
    check.probe = answer
    versions = answer.versions
    wrong_python = python_problem(answer.python, need, bool(versions.get("tensorflow")))
    if wrong_python:
        # Installing packages for this python would not help: it is the python to change.
        check.problems.append(f"{label}: {wrong_python}")
    missing = [package for package, version in versions.items() if version is None]
    if missing and not wrong_python:
        names = " and ".join(filter(None, [", ".join(missing[:-1]), missing[-1]]))
        check.problems.append(f"{label}: {names} {'is' if len(missing) == 1 else 'are'} not "
                              f"installed for {answer.executable or host.python} "
                              f"({install_hint(missing, answer.externally_managed)})")
    tf, tfk = versions.get("tensorflow"), versions.get("tf_keras")
    if tf and tfk and minor(tf) != minor(tfk):
        check.problems.append(f"{label}: tf_keras {tfk} does not match tensorflow {tf} "
                              f"(pip install 'tf-keras~={minor(tf)}.0')")
    if not answer.ipv6 and host.tf_address.is_v6:
        check.problems.append(f"{label}: cluster address {host.tf_address} is IPv6, but the "
                              f"host has no IPv6 (its Python cannot open an IPv6 socket); set "
                              f"cluster_address to an IPv4 address of the host")
    no_gpu = gpu_problem(host, answer)
    if no_gpu:
        check.problems.append(no_gpu)
    if answer.data_problem:
        check.problems.append(f"{label}: field 'data': remote path {host.data.path} "
                              f"{answer.data_problem} on the host")
    if answer.workdir_problem:
        check.problems.append(f"{label}: {answer.workdir_problem}")
    elif not answer.writable:
        check.problems.append(f"{label}: cannot create the workdir {host.workdir}: "
                              f"{answer.disk_path} is not writable")
    no_room = (room_problem(label, answer.disk_free, answer.disk_path, push_bytes)
               if push_bytes else None)
    if no_room:
        check.problems.append(no_room)
    elif answer.disk_free < MIN_DISK_FREE:
        check.problems.append(f"{label}: only {size(answer.disk_free)} free under "
                              f"{answer.disk_path} (workdir {host.workdir}); a run needs "
                              f"at least {size(MIN_DISK_FREE)}")


def gpu_lines(report: CheckReport) -> list[str]:
    """Every host's GPUs, one line each: model, memory in use, utilisation, and who holds it
    (busy, as a run would judge it: deploy/host/gpus.py); a host without one says why. Nothing
    where no host has a GPU or asks for one."""
    if not any(c.probe and c.probe.gpus or c.host.gpus is not None for c in report.hosts):
        return []
    lines = []
    for c in report.hosts:
        if c.probe is None:
            continue
        if not c.probe.gpus:
            lines.append(f"{c.host.name}: no GPU ({c.probe.gpu_note or 'none listed'})")
        for gpu in c.probe.gpus:
            busy = busy_reason(asdict(gpu))
            memory = "-" if gpu.memory_total is None else (
                f"{'?' if gpu.memory_used is None else gpu.memory_used}/{gpu.memory_total} MiB")
            use = "-" if gpu.utilization is None else f"{gpu.utilization}%"
            lines.append(f"{c.host.name}: GPU {gpu.index} {gpu.name}  {memory}  {use}  "
                         f"{'busy: ' + busy if busy else 'free'}")
    return lines


def gpu_problem(host: Host, answer: Probe) -> str | None:
    """A host whose inventory asks for GPUs and has none."""
    if host.gpus is None or answer.gpus:
        return None
    why = answer.gpu_note or "none listed"
    return (f"{host.label}: field 'gpus': the host has no GPU ({why}); remove gpus, or "
            f"install the NVIDIA driver there")


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def version_problems(checks: list[HostCheck]) -> list[str]:
    """Workers of different TensorFlow or tf_keras versions may fail to join or compute
    differently; this can only be seen by asking the hosts."""
    problems = []
    for package in ("tensorflow", "tf_keras"):
        seen: dict[str, list[str]] = {}
        for c in checks:
            version = c.probe.versions.get(package) if c.probe else None
            if version:
                seen.setdefault(version, []).append(c.host.name)
        if len(seen) > 1:
            where = "; ".join(f"{v} on {', '.join(names)}" for v, names in sorted(seen.items()))
            problems.append(f"{package} differs between hosts: {where} — install one version "
                            f"everywhere")
    return problems


def assign_task_ports(checks: list[HostCheck]) -> str | None:
    """Give every task a port from its host's free ports, as a run does (ports.py); returns a
    problem or None."""
    try:
        ports = choose_ports([(c.host, c.host.cluster_tasks) for c in checks],
                             {c.host.name: list(c.probe.ports) for c in checks})
    except PortsUnavailable as exc:
        return str(exc)
    for c in checks:
        c.ports = ports[c.host.name]
    return None


def mesh_pairs(checks: list[HostCheck]) -> list[tuple[HostCheck, HostCheck, int]]:
    """(from host, to host, port): every host dials every task but its own single one. A
    host with several tasks dials them too, as its tasks will dial each other. An evaluator
    host listens on nothing and dials nothing: it only reads the chief's checkpoints."""
    return [(src, dst, port) for src in checks if src.host.cluster_tasks
            for dst in checks for port in dst.ports
            if src is not dst or len(dst.ports) > 1]


def mesh_specs(checks: list[HostCheck], nonce: str) -> dict[str, dict]:
    specs = {c.host.name: {"host": c.host.name, "nonce": nonce, "window": MESH_WINDOW,
                           "attempt": MESH_ATTEMPT, "driven": MESH_DEADLINE,
                           "listen": {str(p): 0 for p in c.ports},
                           "targets": []} for c in checks}
    for src, dst, port in mesh_pairs(checks):
        specs[dst.host.name]["listen"][str(port)] += 1
        target = (str(dst.host.tf_address), port, dst.host.name)
        specs[src.host.name]["targets"].append(target)
    return specs


def judge_mesh(checks: list[HostCheck], answers: dict[str, MeshResult],
               errors: dict[str, str]) -> None:
    """Turn each host's connection results into problems on the host that was not reached. A
    result about a host that is not in the check (its answer names it) is that answer's
    problem."""
    by_name = {c.host.name: c for c in checks}
    tally = {c.host.name: [0, 0, 0, 0] for c in checks}   # in ok, in tried, out ok, out tried
    for c in checks:
        name = c.host.name
        if name in errors:
            c.problems.append(errors[name])   # names the host already
            continue
        answer = answers[name]
        for port, error in answer.bind_errors.items():
            c.problems.append(f"{c.host.label}: cannot listen on port {port}: {error} — taken "
                              f"by another program?")
        for result in answer.connects:
            dst = by_name.get(result.host)
            if dst is None:
                c.problems.append(f"{c.host.label}: its mesh check names a host that is not "
                                  f"in it: {result.host!r}")
                continue
            ok = result.ok
            tally[name][2:] = [tally[name][2] + ok, tally[name][3] + 1]
            tally[dst.host.name][:2] = [tally[dst.host.name][0] + ok, tally[dst.host.name][1] + 1]
            if not ok:
                dst.problems.append(mesh_problem(dst.host, result, c.host))
    for c in checks:
        t = tally[c.host.name]
        c.mesh_in, c.mesh_out = (t[0], t[1]), (t[2], t[3])


def mesh_problem(dst: Host, result: Connect, src: Host) -> str:
    where = f"{tf_label(dst)}: port {result.port}"
    error, detail = result.error, result.detail
    frm = "itself" if src.name == dst.name else src.name
    if error == "timeout" or error == "no answer":
        return (f"{where} not reachable from {frm} (no answer within {MESH_WINDOW:g} s) "
                f"— firewall?")
    if error == "refused":
        return (f"{where} refused a connection from {frm}: nothing listens there — is "
                f"{dst.tf_address} really {dst.name}'s address (cluster_address)?")
    if error == "wrong-host":
        return (f"{where}: {frm} reached host {detail}'s listener instead — {dst.name} and "
                f"{detail} have cluster addresses that lead to the same machine")
    if error == "foreign":
        return (f"{where}: {frm} reached another program, not {dst.name} — is "
                f"{dst.tf_address} really {dst.name}'s address (cluster_address)?")
    return f"{where} not reachable from {frm}: {error} — routing or firewall?"


def rows(report: CheckReport) -> list[list[str]]:
    """One row per host: host, address, python, tensorflow, tf_keras, numpy, disk free, ports,
    mesh, problems."""
    out = []
    for c in report.hosts:
        address = "local" if c.host.transport == "local" else c.host.address
        if str(c.host.tf_address) != c.host.address:
            address += f" (cluster {c.host.tf_address})"
        if c.host.via:
            address += " via " + ",".join(h.name for h in c.host.via)
        probe = c.probe
        versions = probe.versions if probe else {}
        cells = [c.host.name, address, probe.python if probe else "-"]
        cells += [versions.get(p) or ("missing" if probe else "-")
                  for p in PACKAGES]
        cells.append(size(probe.disk_free) if probe else "-")
        cells.append(", ".join(map(str, c.ports)) or "-")
        cells.append(mesh_cell(c))
        cells.append("\n".join(c.problems) or "ok")
        out.append(cells)
    return out


def mesh_cell(c: HostCheck) -> str:
    if not c.mesh_in[1] and not c.mesh_out[1]:
        return "-"
    if c.mesh_in[0] == c.mesh_in[1] and c.mesh_out[0] == c.mesh_out[1]:
        return "ok"
    return f"in {c.mesh_in[0]}/{c.mesh_in[1]}, out {c.mesh_out[0]}/{c.mesh_out[1]}"
