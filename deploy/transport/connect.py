"""The transport a host's inventory entry asks for."""
from __future__ import annotations

from deploy.inventory.model import Host
from deploy.transport.base import Transport
from deploy.transport.local import LocalTransport
from deploy.transport.slurm import SlurmTransport
from deploy.transport.ssh import SshTransport


def connect(host: Host, connect_timeout: float = 10.0,
            accept_new_host_keys: bool = False) -> Transport:
    if host.transport == "local":
        return LocalTransport(host)
    if host.transport == "slurm":
        return SlurmTransport(host)
    return SshTransport(host, connect_timeout, accept_new_host_keys)
