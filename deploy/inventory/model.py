"""The inventory as values: hosts and their fields, frozen and validated once by load.py, so
that everything downstream can trust them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from deploy.errors import BadInput
from deploy.host.layout import TASK_TYPES
from deploy.inventory import sshconfig
from deploy.inventory.address import Address
from deploy.inventory.datasource import DataSource
from deploy.inventory.sshconfig import Hop


# The task types of a TensorFlow cluster (TF_CONFIG's task types), as the inventory's `role:`.
# A cluster with only workers is a MultiWorkerMirroredStrategy cluster, as it always was; a
# chief, ps or evaluator makes it a parameter-server cluster (docs/design.md, "Roles").
# A spare runs no task: checked and pushed to like the others, it takes a lost host's tasks
# (run/recovery.py).
SPARE = "spare"
ROLES = TASK_TYPES + (SPARE,)
# The types in TF_CONFIG's cluster dict, in the order written there: the evaluator is not in it.
CLUSTER_ROLES = ("chief", "worker", "ps")


class InventoryError(BadInput):
    """A problem in the inventory, located as precisely as the input allows."""

    def __init__(self, file: str, message: str, host: str | None = None,
                 field: str | None = None, line: int | None = None):
        self.file, self.host, self.field, self.line = file, host, field, line
        where = file + (f":{line}" if line else "")
        parts = [where]
        if host:
            parts.append(f"host {host!r}")
        if field:
            parts.append(f"field {field!r}")
        super().__init__(": ".join(parts) + ": " + message)


@dataclass(frozen=True)
class EnvValue:
    """One environment value for a task; secret ones print as *** everywhere but the wire."""
    value: str
    secret: bool = False

    def shown(self) -> str:
        return "***" if self.secret else self.value


@dataclass(frozen=True)
class Host:
    name: str
    address: str                     # as given, brackets taken off an IPv6 address
    transport: str = "ssh"
    port: int | None = None          # as given; None: the ssh config's Port, else 22
    user: str | None = None          # as given; None: the ssh config's User, else the local user
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: str = "strict"
    python: str = "python3"          # a local host defaults to the controller's own Python
    workdir: str = "~/.tfdeploy"
    cluster_address: str = ""        # as given, brackets taken off an IPv6 address
    workers: int = 1                 # tasks on this host, each of its role
    role: str = "worker"             # one of ROLES
    env: Mapping[str, EnvValue] = field(default_factory=dict)
    own_python: bool = False         # `python` given in the inventory: `inv setup`'s env unused
    # One task per listed GPU; N: per free GPU, N of them; "free": per free GPU; "all": one
    # task that sees every GPU. N and "free" become a list when the run starts (gpuplace.py).
    gpus: tuple[int, ...] | int | str | None = None
    data: DataSource | None = None   # TFDEPLOY_DATA_DIR: local dir pushed by content, or remote
    ssh_config: str = sshconfig.DEFAULT_FILE
    jump: str | None = None          # gateway(s), ProxyJump syntax, as given
    # Resolved through the ssh config when the inventory is loaded (see sshconfig.py).
    target: Hop | None = None
    via: tuple[Hop, ...] = ()        # gateways, first hop first
    slurm_job: str = ""              # transport slurm: the allocation's job id (slurm.py)

    @property
    def ssh(self) -> Hop:
        """How the controller logs in: resolved, or else the inventory's values as they are."""
        return self.target or Hop(self.address, self.address, self.port or 22, self.user,
                                  (self.identity_file,) if self.identity_file else ())

    @property
    def tf_address(self) -> Address:
        """The address other tasks use to reach this host's TensorFlow ports: an ssh-config
        alias means nothing on the other hosts, so by default it is the alias's HostName."""
        return Address.parse(self.cluster_address) if self.cluster_address else self.ssh.address

    @property
    def tasks(self) -> int:
        """How many tasks it runs: `workers`, none while it is a spare."""
        return 0 if self.role == SPARE else self.workers

    @property
    def cluster_tasks(self) -> int:
        """Its tasks that are in the cluster dict and listen on a port: the evaluator is not."""
        return 0 if self.role == "evaluator" else self.tasks

    @property
    def label(self) -> str:
        if self.transport == "local":
            return self.name
        where = self.address if self.ssh.hostname == self.address else (
            f"{self.address} = {self.ssh.hostname}")
        if self.via:
            where += " via " + ",".join(hop.name for hop in self.via)
        return f"{self.name} ({where})"


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: tuple[Host, ...]

    @property
    def task_count(self) -> int:
        return sum(h.tasks for h in self.hosts)

    @property
    def has_roles(self) -> bool:
        """Whether any host has a task type other than worker: a parameter-server cluster."""
        return any(h.role not in ("worker", SPARE) for h in self.hosts)
