"""How tfdeploy will log in to each host (`inv hosts`): the resolved logins, as a document
(one object per inventory host) and as text. Paths are shown expanded as they will be used."""
from __future__ import annotations

import os

from deploy.inventory import openssh
from deploy.inventory.model import Host, Inventory
from deploy.inventory.slurm import srun_argv
from deploy.inventory.sshconfig import Hop


def login_document(host: Host) -> dict:
    if host.transport == "local":
        return {"name": host.name, "transport": "local"}
    if host.transport == "slurm":
        return {"name": host.name, "transport": "slurm", "job": host.slurm_job,
                "srun": srun_argv(host), "cluster_address": host.tf_address.text}
    hop = host.ssh
    return {
        "name": host.name, "hostname": hop.hostname, "user": user_of(hop), "port": hop.port,
        "identity_files": [os.path.expanduser(f) for f in hop.identity_files],
        "identities_only": hop.identities_only,
        "identity_agent": hop.identity_agent,
        "certificate_files": [os.path.expanduser(f) for f in hop.certificate_files],
        "host_key_alias": hop.host_key_alias,
        "known_hosts": list(hop.known_hosts if hop.known_hosts is not None
                            else (os.path.expanduser(host.known_hosts),)),
        "global_known_hosts": list(hop.global_known_hosts),
        "host_key_policy": host.host_key_policy,
        "connect_timeout": hop.connect_timeout,
        "jump": [f"{user_of(h)}@{h.hostname}:{h.port}" for h in host.via],
        "proxy_command": hop.proxy_command,
        "cluster_address": host.tf_address.text,
    }


def user_of(hop: Hop) -> str:
    return hop.user or openssh.local_user()


def login_documents(inventory: Inventory) -> list[dict]:
    return [login_document(host) for host in inventory.hosts]


def login_text(inventory: Inventory) -> str:
    lines = []
    for doc in login_documents(inventory):
        if doc.get("transport") == "local":
            lines.append(f"{doc['name']}: local (no SSH)")
            continue
        if doc.get("transport") == "slurm":
            lines += [f"{doc['name']}: a step of Slurm job {doc['job']} (no SSH)",
                      f"    {' '.join(doc['srun'])}",
                      f"    cluster address: {doc['cluster_address']}"]
            continue
        lines.append(f"{doc['name']}: ssh {doc['user']}@{doc['hostname']}:{doc['port']}")
        route = (f"via {' -> '.join(doc['jump'])}" if doc["jump"] else
                 f"through ProxyCommand: {doc['proxy_command']}" if doc["proxy_command"]
                 else "direct")
        keys = ", ".join(doc["identity_files"]) or "ssh's defaults (~/.ssh/id_*)"
        lines += [f"    {route}",
                  f"    keys: {keys}" + ("; identities only" if doc["identities_only"] else
                                        "; then ssh-agent"),
                  f"    host key: looked up as "
                  f"{doc['host_key_alias'] or _lookup(doc)} in "
                  f"{', '.join(doc['known_hosts'] + doc['global_known_hosts']) or 'no file'}"
                  f" ({doc['host_key_policy']})",
                  f"    cluster address: {doc['cluster_address']}"]
    return "\n".join(lines) + "\n"


def _lookup(doc: dict) -> str:
    return doc["hostname"] if doc["port"] == 22 else f"[{doc['hostname']}]:{doc['port']}"
