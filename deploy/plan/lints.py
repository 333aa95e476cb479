"""Mistakes that would make TensorFlow hang rather than fail, caught before anything starts."""
from __future__ import annotations

import re
from pathlib import Path

from deploy.errors import BadInput
from deploy.inventory.model import SPARE, Inventory

MULTI_WORKER = re.compile(r"\bMultiWorkerMirroredStrategy\b")
PARAMETER_SERVER = re.compile(r"\bParameterServerStrategy\b")
KERAS3_IMPORT = re.compile(r"^\s*(import\s+keras\b|from\s+keras(\.|\s+import)\b)", re.MULTILINE)


class LintFailed(BadInput):
    pass


def cluster_problems(inventory: Inventory) -> list[str]:
    """A loopback cluster address is fine when every host is on loopback (one machine, or a
    test lab); beside real hosts it makes the others dial themselves and wait forever."""
    loopback = [h for h in inventory.hosts if h.tf_address.is_loopback]
    if not loopback or len(loopback) == len(inventory.hosts):
        return []
    others = ", ".join(h.name for h in inventory.hosts if h not in loopback)
    return [f"{inventory.path}: host {h.name!r}: cluster address {str(h.tf_address)!r} is "
            f"loopback, but {others} cannot reach it there; set cluster_address to an address "
            f"the other hosts can reach" for h in loopback]


def zone_problems(inventory: Inventory) -> list[str]:
    """An IPv6 link-local cluster address needs the interface it is reached on (`%eth0`),
    which is a different one on every host: TF_CONFIG cannot carry it for all of them."""
    return [f"{inventory.path}: host {h.name!r}: cluster address {str(h.tf_address)!r} is "
            f"IPv6 link-local (fe80::/10), which is reachable only through a named interface "
            f"that differs from host to host; set cluster_address to a global or unique-local "
            f"(fd00::/8) address of {h.name}, or an IPv4 address"
            for h in inventory.hosts if h.tf_address.needs_zone]


def endpoint_problems(inventory: Inventory) -> list[str]:
    """Two hosts reached over SSH at different addresses but giving the same cluster address.

    Ports are chosen at launch and kept distinct across the cluster, so two tasks never share
    an address:port and a shared address alone is no clash. The conflict is that a port found
    free on one machine would be dialled on another: one of the two cluster addresses is wrong.
    Entries with the same SSH address (another port, user or workdir) are one machine, so one
    address is right for both; so is a cluster entirely on loopback (one machine, a test lab).
    """
    if all(h.tf_address.is_loopback for h in inventory.hosts):
        return []
    problems, first = [], {}
    for host in inventory.hosts:
        other = first.setdefault(host.tf_address.key, host)
        if other is not host and _machine(other) != _machine(host):
            problems.append(
                f"{inventory.path}: host {host.name!r}: cluster address "
                f"{str(host.tf_address)!r} is also that of host {other.name!r}, but they are "
                f"reached at different SSH addresses ({_reached(other)}, {_reached(host)}); the "
                f"other hosts would dial {host.name}'s tasks on {other.name}: set "
                f"cluster_address to the address of {host.name} itself")
    return problems


def role_problems(inventory: Inventory) -> list[str]:
    """Clusters TensorFlow cannot run: one chief at most (a chief host with `workers: 2` is two
    chiefs), ps tasks only beside a chief that drives them, a chief or ps only with workers
    to run the steps, one evaluator at most and only beside a chief (the run ends with it)."""
    def where(host, message: str) -> str:
        return f"{inventory.path}: host {host.name!r}: field 'role': {message}"
    hosts = inventory.hosts
    of = {role: [h for h in hosts if h.role == role] for role in ("chief", "worker", "ps",
                                                                  "evaluator")}
    count = {role: sum(h.workers for h in found) for role, found in of.items()}
    problems = []
    if count["chief"] > 1:
        names = ", ".join(f"{h.name} ({h.workers})" if h.workers > 1 else h.name
                          for h in of["chief"])
        problems.append(where(of["chief"][-1], f"{count['chief']} chief tasks ({names}); a "
                              f"cluster has one chief: give one host role chief with one task "
                              f"(workers: 1)"))
    if of["ps"] and not of["chief"]:
        problems.append(where(of["ps"][0], "ps tasks need a chief to drive the training (its "
                              "coordinator): give one host role: chief"))
    if (of["chief"] or of["ps"]) and not of["worker"]:
        host = (of["chief"] or of["ps"])[0]
        problems.append(where(host, f"a {host.role} needs worker tasks to run the training "
                              f"steps, and no host has role worker (the default)"))
    if of["evaluator"] and not of["chief"]:
        problems.append(where(of["evaluator"][0], "an evaluator evaluates a chief's checkpoints "
                              "in parameter-server training: give one host role: chief"))
    if count["evaluator"] > 1:
        problems.append(where(of["evaluator"][-1], f"{count['evaluator']} evaluator tasks; a "
                              f"cluster has at most one evaluator (workers: 1)"))
    spares = [h for h in hosts if h.role == SPARE]
    if spares and not inventory.task_count:
        problems.append(where(spares[0], "every host is a spare: give at least one host a "
                                         "task (role: worker, the default)"))
    elif spares and inventory.has_roles:
        problems.append(where(spares[0], "a spare replaces a lost host of a "
                                         "MultiWorkerMirroredStrategy cluster (workers only); a "
                                         "parameter-server cluster cannot take one"))
    return problems


def _machine(host) -> tuple:
    """The machine an SSH login reaches: its resolved address, behind the same gateways (an
    alias and its HostName are one machine; one private address behind two gateways is two)."""
    return (host.ssh.address.key, tuple(h.shown() for h in host.via))


def _reached(host) -> str:
    return host.ssh.hostname + (" via " + ",".join(h.name for h in host.via) if host.via else "")


def payload_problems(payload: Path, tasks: int) -> list[str]:
    """Keras 3 cannot run multi-worker fit; the payload must use tf_keras."""
    if tasks < 2 or not payload.is_dir():
        return []
    problems = []
    for path in sorted(payload.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        match = KERAS3_IMPORT.search(text)
        if match:
            line = text.count("\n", 0, match.start()) + 1
            problems.append(
                f"{path}:{line}: imports Keras 3 ({match.group(1).strip()!r}), which cannot run "
                f"multi-worker training; use 'import tf_keras as keras' (tfdeploy sets "
                f"TF_USE_LEGACY_KERAS=1, so tf.keras is tf_keras too)")
    return problems


def strategy_problems(inventory: Inventory, payload: Path) -> list[str]:
    """A cluster with ps tasks run by a payload that says it uses MultiWorkerMirroredStrategy
    and never ParameterServerStrategy: its workers would wait for peers that never join.
    Told from the text of the payload's Python files, where it can be told."""
    ps = [h for h in inventory.hosts if h.role == "ps"]
    if not ps or not payload.is_dir():
        return []
    multi, either = None, False
    for path in sorted(payload.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        either = either or bool(PARAMETER_SERVER.search(text))
        match = MULTI_WORKER.search(text)
        if match and multi is None:
            multi = f"{path}:{text.count(chr(10), 0, match.start()) + 1}"
    if multi is None or either:
        return []
    return [f"{inventory.path}: host {ps[0].name!r}: field 'role': ps tasks need a payload "
            f"that trains with ParameterServerStrategy, but {multi} uses "
            f"MultiWorkerMirroredStrategy (and no file of the payload names "
            f"ParameterServerStrategy); remove the ps, chief and evaluator roles to train with "
            f"it"]


def lint(inventory: Inventory, payload: Path) -> list[str]:
    return (role_problems(inventory) + cluster_problems(inventory) + zone_problems(inventory)
            + endpoint_problems(inventory) + payload_problems(payload, inventory.task_count)
            + strategy_problems(inventory, payload))


def public_warnings(inventory: Inventory) -> list[str]:
    """TensorFlow's task ports take unauthenticated requests (graph ops that read and write
    files as the task's user) from anyone who reaches them: on a public address, that may be
    anyone. A warning, not a refusal: a firewall may well close them."""
    return [f"{inventory.path}: host {h.name!r}: cluster address {h.tf_address} is a public "
            f"IPv{h.tf_address.ip.version} address; TensorFlow's task ports accept "
            f"unauthenticated requests from anyone who can reach them: train over a private "
            f"network, or let a firewall admit only the cluster's hosts"
            for h in inventory.hosts if h.tf_address.is_global]


def refuse_problems(inventory: Inventory, payload: Path) -> None:
    """LintFailed naming every problem of `inventory` with `payload`, before anything runs."""
    problems = lint(inventory, payload)
    if problems:
        raise LintFailed("\n".join(problems))
