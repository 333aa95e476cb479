"""Host key policies: known_hosts is respected, and accepting a new key is an explicit choice."""
from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from deploy.errors import Failure


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _address(name: str) -> str:
    """known_hosts' name of a host -> its address: `[10.0.0.5]:2222` -> `10.0.0.5`; a name
    on port 22 is the address itself."""
    if name.startswith("["):
        return name[1:name.index("]")]
    return name


class HostKeyRefused(Failure):
    pass


class RefuseUnknown(paramiko.MissingHostKeyPolicy):
    """Refuse a host whose key is not in known_hosts, saying how to accept it."""

    def __init__(self, label: str, known_hosts: Path, port: int, scan_from: str = ""):
        self.label, self.known_hosts, self.port = label, known_hosts, port
        self.scan_from = scan_from       # e.g. `ssh ssh://gw:22 `: a host behind a gateway

    def missing_host_key(self, client, hostname, key):
        raise HostKeyRefused(
            f"{self.label}: host key not in {self.known_hosts} ({key.get_name()} "
            f"{fingerprint(key)}). If that fingerprint is right, accept it once with "
            f"--accept-new-host-keys (or host_key_policy: accept-new in the inventory), "
            f"or add it with: {self.scan_from}ssh-keyscan -p {self.port} {_address(hostname)}"
            f" >> {self.known_hosts}")


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """Record a key never seen before in known_hosts (like OpenSSH's accept-new)."""

    def __init__(self, known_hosts: Path):
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def configure(client: paramiko.SSHClient, label: str, known_hosts: str, port: int,
              accept_new: bool, scan_from: str = "") -> None:
    """Load known_hosts and set the policy for keys it lacks. A changed key is always
    refused: paramiko raises BadHostKeyException before any policy is asked."""
    path = Path(known_hosts).expanduser()
    if path.exists():
        client.load_host_keys(str(path))
    policy = AcceptNew(path) if accept_new else RefuseUnknown(label, path, port, scan_from)
    client.set_missing_host_key_policy(policy)
