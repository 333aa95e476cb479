"""The agents' channel two ways, on the same SSH lab hosts: paramiko (what tfdeploy uses: one
login per host in the controller's process) against the system `ssh` program (one `ssh`
process per host, its stdin and stdout as the channel, as Mitogen and Ansible use it).

Each side logs in to every host, starts its agent, asks every host for free ports (one round
trip), and closes; alternating, medians of the repeats. The agent and the requests are the
same on both sides: only the channel differs.

    python benchmarks/bench_channel.py [--repeats 5] [--hosts 4 16]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_hosts import ssh_config
from bench_train import REPO, line

sys.path[:0] = [str(REPO), str(REPO / "tests")]   # this checkout's deploy/, the lab
from sshlab import SshLab  # noqa: E402

from deploy.inventory.load import load_inventory  # noqa: E402
from deploy.host.protocol import PortsRequest  # noqa: E402
from deploy.plan.command import Request  # noqa: E402
from deploy.cluster.hostagent import HostAgent  # noqa: E402
from deploy.cluster.session import Session, gather  # noqa: E402
from deploy.transport.base import PRIVATE  # noqa: E402
from deploy.transport.local import LocalStream  # noqa: E402

FIRST_OCTET = 110
PORTS = Request(PortsRequest(2))


class SshProgramStream(LocalStream):
    """A command run by the system `ssh`, its stdin and stdout the channel."""

    def __init__(self, argv: list[str]):
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errors, start_new_session=True)


class SshProgramTransport:
    def __init__(self, host, config: Path):
        self.host, self.config = host, config

    def stream(self, command_line: str) -> SshProgramStream:
        return SshProgramStream(["ssh", "-F", str(self.config), "-T", self.host.name,
                                 PRIVATE + command_line])

    def close(self) -> None:
        pass


def with_paramiko(inventory) -> float:
    started = time.monotonic()
    session, errors = Session.open_each(inventory.hosts, 10, False)
    try:
        assert not errors, errors
        _, failed = gather({name: agent.ask(PORTS, "ports")
                            for name, agent in session.agents.items()}, 60)
        assert not failed, failed
    finally:
        session.close()
    return time.monotonic() - started


def with_ssh_program(inventory, config: Path) -> float:
    started = time.monotonic()
    agents = {h.name: HostAgent(h, SshProgramTransport(h, config)) for h in inventory.hosts}
    try:
        _, failed = gather({name: agent.ask(PORTS, "ports")
                            for name, agent in agents.items()}, 60)
        assert not failed, failed
    finally:
        for agent in agents.values():
            agent.close()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16])
    opts = parser.parse_args()
    for count in opts.hosts:
        with tempfile.TemporaryDirectory(prefix="bench-channel-") as tmp, \
                SshLab(Path(tmp) / "lab", first_octet=FIRST_OCTET) as lab:
            hosts = lab.start(count)
            inventory = load_inventory(lab.write_inventory(Path(tmp) / "hosts.yaml", hosts))
            config = ssh_config(lab, hosts, Path(tmp) / "ssh_config")
            ours, program = [], []
            for _ in range(opts.repeats):
                ours.append(with_paramiko(inventory))
                program.append(with_ssh_program(inventory, config))
        print(f"{count} SSH hosts on loopback: log in, start the agent, one request, close; "
              f"{opts.repeats} repeats, alternating")
        print(line("paramiko (one process):", ours, 36))
        print(line("system ssh (one process per host):", program, 36))
        print(f"ratio paramiko / system ssh: "
              f"{statistics.median(ours) / statistics.median(program):.2f}x", flush=True)


if __name__ == "__main__":
    main()
