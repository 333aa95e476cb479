"""Mistakes that would make TensorFlow hang rather than fail, caught before anything starts."""
from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from deploy.errors import BadInput
from deploy.inventory.model import Inventory

KERAS3_IMPORT = re.compile(r"^\s*(import\s+keras\b|from\s+keras(\.|\s+import)\b)", re.MULTILINE)


class LintFailed(BadInput):
    pass


def is_loopback(address: str) -> bool:
    if address.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def cluster_problems(inventory: Inventory) -> list[str]:
    """A loopback cluster address is fine when every host is on loopback (one machine, or a
    test lab); beside real hosts it makes the others dial themselves and wait forever."""
    loopback = [h for h in inventory.hosts if is_loopback(h.tf_address)]
    if not loopback or len(loopback) == len(inventory.hosts):
        return []
    others = ", ".join(h.name for h in inventory.hosts if h not in loopback)
    return [f"{inventory.path}: host {h.name!r}: cluster address {h.tf_address!r} is loopback, "
            f"but {others} cannot reach it there; set cluster_address to an address the other "
            f"hosts can reach" for h in loopback]


def endpoint_problems(inventory: Inventory) -> list[str]:
    """Two hosts reached over SSH at different addresses but giving the same cluster address.

    Ports are chosen at launch and kept distinct across the cluster, so two tasks never share
    an address:port and a shared address alone is no clash. The conflict is that a port found
    free on one machine would be dialled on another: one of the two cluster addresses is wrong.
    Entries with the same SSH address (another port, user or workdir) are one machine, so one
    address is right for both; so is a cluster entirely on loopback (one machine, a test lab).
    """
    if all(is_loopback(h.tf_address) for h in inventory.hosts):
        return []
    problems, first = [], {}
    for host in inventory.hosts:
        other = first.setdefault(host.tf_address.lower(), host)
        if other is not host and _machine(other) != _machine(host):
            problems.append(
                f"{inventory.path}: host {host.name!r}: cluster address {host.tf_address!r} is "
                f"also that of host {other.name!r}, but they are reached at different SSH addresses "
                f"({_reached(other)}, {_reached(host)}); the other hosts would dial {host.name}'s "
                f"tasks on {other.name}: set cluster_address to the address of {host.name} "
                f"itself")
    return problems


def _machine(host) -> tuple:
    """The machine an SSH login reaches: its resolved address, behind the same gateways (an
    alias and its HostName are one machine; one private address behind two gateways is two)."""
    return (host.ssh.hostname.lower(), tuple(h.shown() for h in host.via))


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


def lint(inventory: Inventory, payload: Path) -> list[str]:
    return (cluster_problems(inventory) + endpoint_problems(inventory)
            + payload_problems(payload, inventory.task_count))



def public_address_warnings(inventory: Inventory) -> list[str]:
    """TensorFlow's gRPC ports take unauthenticated requests: a cluster address that is a
    global (public) IP lets anyone who reaches it run operations as the task's user. A warning,
    not a refusal: a firewall may well close the ports. Names are not resolved."""
    warnings = []
    for host in inventory.hosts:
        try:
            public = ipaddress.ip_address(host.tf_address).is_global
        except ValueError:
            continue
        if public:
            warnings.append(
                f"{inventory.path}: host {host.name!r}: cluster address {host.tf_address} is a "
                f"public IP; TensorFlow's gRPC ports accept unauthenticated requests: train on "
                f"a private network or firewall the ports to the cluster")
    return warnings


def refuse_problems(inventory: Inventory, payload: Path) -> None:
    """LintFailed naming every problem of `inventory` with `payload`, before anything runs."""
    problems = lint(inventory, payload)
    if problems:
        raise LintFailed("\n".join(problems))
