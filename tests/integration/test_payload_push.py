"""The push as the controller drives it (deploy/push.py, Session.push), on a local host: two
requests to its agent, the stage (answered with what its cache lacks) and exactly those files;
one when nothing changed."""
from __future__ import annotations

import hashlib
import os
import socket
import sys
from pathlib import Path

import paramiko
import pytest
from rich.console import Console

from counting import CountingTransport
from deploy.inventory.load import load_inventory, parse_inventory
from deploy.plan.planner import Options, cleanup_request, plan_run
from deploy.push.payload import PayloadPush
from deploy.transport.login import LoginTransport
from deploy.transport.ssh import SshTransport
from deploy.cluster.hostagent import HostAgent
from deploy.cluster.parallel import HostsFailed
from deploy.cluster.session import Session


QUIET = Console(file=open(os.devnull, "w"))


class CountingAgent(HostAgent):
    """A host's agent that keeps the verbs it is asked."""

    def __init__(self, *args):
        self.asked: list[str] = []
        super().__init__(*args)

    def ask(self, request, *args, **kwargs):
        self.asked.append(request.verb)
        return super().ask(request, *args, **kwargs)


@pytest.fixture
def lab(tmp_path):
    payload = tmp_path / "payload"
    (payload / "data").mkdir(parents=True)
    (payload / "train.py").write_text("print('hi')\n")
    (payload / "data" / "weights.bin").write_bytes(bytes(range(256)) * 8192)    # 2 MiB
    inventory = parse_inventory(
        f"hosts:\n  - {{name: h, transport: local, workdir: '{tmp_path / 'work dir'}', "
        f"python: '{sys.executable}'}}\n", "h.yaml", environ={})
    transport = CountingTransport(inventory.hosts[0])
    session = Session({"h": transport}, {"h": CountingAgent(inventory.hosts[0], transport)})
    try:
        yield payload, inventory, session, tmp_path / "hashes.json"
    finally:
        session.close()


def push(payload: Path, inventory, session, hashes: Path, run_id: str):
    pushing = PayloadPush(payload, "train.py", run_id, hash_cache=hashes)
    plan = plan_run(inventory, Options(payload=str(payload)), run_id)
    session.agents["h"].asked.clear()
    record = pushing.send(session, plan, QUIET.status, lambda line: None)
    return record["hosts"]["h"], Path(plan.hosts[0].run_dir)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_what_the_cache_lacks_travels_on_the_same_channel(lab):
    payload, inventory, session, hashes = lab
    answer, rundir = push(payload, inventory, session, hashes, "20260101-000000-aaaaaa")
    big = sha((payload / "data" / "weights.bin").read_bytes())
    # The small new file rode along with the manifest; the big one was asked for and sent.
    assert answer["missing"] == [big]
    assert sorted(answer["received"]) == sorted([big, sha(b"print('hi')\n")])
    assert answer["bytes"] == 2 * 1024 * 1024 and answer["files"] == 2
    assert session.agents["h"].asked == ["push", "receive"]
    assert (rundir / "payload" / "data" / "weights.bin").read_bytes() == (
        payload / "data" / "weights.bin").read_bytes()

    again, rundir = push(payload, inventory, session, hashes, "20260101-000000-bbbbbb")
    assert again.pop("filesystem") == answer["filesystem"]     # the workdir's, as it answered
    assert again == {"missing": [], "received": [], "files": 2, "assembled": True}
    assert session.agents["h"].asked == ["push"]          # an unchanged payload: one round trip
    assert session.transports["h"].commands == 0          # nothing beside the agent's channel
    assert (rundir / "payload" / "train.py").read_text() == "print('hi')\n"


def test_a_file_changed_while_it_is_pushed_leaves_no_payload(lab):
    payload, inventory, session, hashes = lab
    pushing = PayloadPush(payload, "train.py", "20260101-000000-cccccc", hash_cache=hashes)
    (payload / "data" / "weights.bin").write_bytes(b"shorter")        # after it was hashed
    plan = plan_run(inventory, Options(payload=str(payload)), "20260101-000000-cccccc")
    with pytest.raises(HostsFailed, match="changed while it was being pushed"):
        pushing.send(session, plan, QUIET.status, lambda line: None)
    rundir = Path(plan.hosts[0].run_dir)
    assert (rundir / "manifest.json").exists() and not (rundir / "payload").exists()
    cached = {p.name for p in (rundir.parents[1] / "cache" / "files").iterdir()}
    assert cached == {sha(b"print('hi')\n")}                  # only verified content
    # The host's agent still answers: the failed run is cleaned up as any other (waited for
    # 15 s here; a run's teardown waits its grace and a minute).
    (hp,) = plan.hosts
    cleaned = session.agents["h"].ask(cleanup_request(hp.host, hp.run_dir, 1), "cleanup").wait(15)
    assert cleaned.survivors == () and not rundir.exists()


def test_ssh_offers_aes_gcm_first_and_every_other_cipher_after_it():
    offered = LoginTransport._preferred_ciphers
    assert offered[0] == "aes128-gcm@openssh.com" and "-gcm@" in offered[1]
    assert sorted(offered) == sorted(paramiko.Transport._preferred_ciphers)


def test_a_logins_small_packets_leave_without_waiting_for_acknowledgements(ssh_lab, tmp_path):
    """TCP_NODELAY on the login's socket: a request's packets after its first no longer wait
    for the host's delayed acknowledgement of the one before."""
    inventory = load_inventory(ssh_lab.write_inventory(tmp_path / "hosts.yaml",
                                                       ssh_lab.hosts[:1]))
    transport = SshTransport(inventory.hosts[0])
    try:
        sock = transport.connection.client.get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert transport.run("echo hi").stdout == b"hi\n"
    finally:
        transport.close()
