"""Logins as OpenSSH makes them, against real sshd servers: hosts reached only through a
ProxyCommand in the ssh config (every login counted by the relay, and seen by sshd coming from
the relay's own address), and host keys recorded only under a HostKeyAlias."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from test_ssh_config import assert_trained_and_gone, empty_home, inv, train, write_yaml

from sshlab import SshLab


RELAY = Path(__file__).resolve().parents[1] / "relay.py"
RELAY_SOURCE = "127.0.0.250"      # the relay's connections, and only they, come from here


def connections(log: Path, start: int) -> list[str]:
    """The client addresses of the connections sshd logged after byte `start`."""
    return re.findall(r"Connection from (\S+) port", log.read_text()[start:])


def test_hosts_behind_a_proxycommand_check_and_train_through_it(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    home = empty_home(tmp_path)
    relayed = tmp_path / "relayed.log"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host relay-*\n    ProxyCommand {sys.executable} {RELAY} {relayed} {RELAY_SOURCE} %h %p\n"
        f"    User {ssh_lab.user}\n    IdentityFile {ssh_lab.identity_file}\n"
        f"    UserKnownHostsFile {ssh_lab.known_hosts}\n"
        + "".join(f"Host relay-{h.name}\n    HostName {h.address}\n    Port {h.port}\n"
                  for h in hosts))
    inventory = write_yaml(tmp_path / "relay.yaml", {
        "defaults": {"python": sys.executable, "ssh_config": str(config)},
        "hosts": [{"name": h.name, "address": f"relay-{h.name}", "workdir": str(h.workdir)}
                  for h in hosts]})
    starts = [len(h.log.read_text()) for h in hosts]

    shown = inv("hosts", "--hosts", str(inventory), "--json", home=home)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert [d["proxy_command"] for d in json.loads(shown.stdout)] == [
        f"{sys.executable} {RELAY} {relayed} {RELAY_SOURCE} {h.address} {h.port}"
        for h in hosts]

    done = inv("check", "--hosts", str(inventory), home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    record = assert_trained_and_gone(train(inventory, tmp_path / "runs", home), hosts)
    # TF_CONFIG names the HostNames: the relay carries the SSH sessions only.
    assert [t["endpoint"].rsplit(":", 1)[0] for t in record["tasks"]] == [
        h.address for h in hosts]
    # Every connection each sshd saw came from the relay, and the relay made each of them.
    seen = [connections(h.log, start) for h, start in zip(hosts, starts)]
    assert all(seen) and {a for s in seen for a in s} == {RELAY_SOURCE}, seen
    lines = relayed.read_text().splitlines()
    assert len(lines) == sum(len(s) for s in seen)
    for host in hosts:
        assert sum(f"{host.address}:{host.port} from" in line for line in lines) >= 2


def test_a_key_known_only_under_its_host_key_alias(tmp_path):
    home = empty_home(tmp_path)
    with SshLab(tmp_path / "lab", first_octet=80) as lab:
        one, two = lab.start(2, record_host_keys=False)
        key = one.host_key.read_text().split()[:2]
        known = tmp_path / "known_hosts"
        # Both aliases hold one's key: right for one, a different key for two.
        known.write_text(f"alias-one {key[0]} {key[1]}\nalias-two {key[0]} {key[1]}\n")
        before = known.read_bytes()
        config = tmp_path / "ssh_config"
        config.write_text("".join(
            f"Host {alias}\n    HostName {h.address}\n    Port {h.port}\n"
            f"    HostKeyAlias alias-{alias}\n" for alias, h in (("one", one), ("two", two)))
            + f"Host *\n    User {lab.user}\n    IdentityFile {lab.identity_file}\n"
            f"    UserKnownHostsFile {known}\n")

        def inventory(alias, host):
            return write_yaml(tmp_path / f"{alias}.yaml", {
                "defaults": {"python": sys.executable, "ssh_config": str(config)},
                "hosts": [{"name": alias, "address": alias, "workdir": str(host.workdir)}]})

        done = inv("check", "--hosts", str(inventory("one", one)), home=home)
        assert done.returncode == 0, done.stdout + done.stderr
        assert known.read_bytes() == before

        refused = inv("check", "--hosts", str(inventory("two", two)), "--accept-new-host-keys",
                      home=home)
        out = " ".join(refused.stdout.split())
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert f"HOST KEY CHANGED for alias-two: {known}:2 has SHA256:" in out, out
        assert "the server offers ssh-ed25519 SHA256:" in out
        assert known.read_bytes() == before


def test_a_chatty_proxycommand_does_not_stall_and_a_failing_one_is_heard(ssh_lab, tmp_path):
    """A ProxyCommand that writes 250 KB of diagnostics to stderr before relaying (more than
    a pipe holds: unread, it would block there and the login would time out) logs in; one
    that fails says why, and the error shows its last words."""
    host = ssh_lab.hosts[0]
    home = empty_home(tmp_path)
    chatty, failing = tmp_path / "chatty-proxy", tmp_path / "failing-proxy"
    chatty.write_text(
        "#!/bin/sh\n"
        "i=0; while [ $i -lt 2500 ]; do echo \"debug1: chatty proxy line $i $(printf "
        "'%080d' 0)\" >&2; i=$((i+1)); done\n"
        f"exec {sys.executable} {RELAY} {tmp_path / 'relayed.log'} {RELAY_SOURCE} \"$@\"\n")
    failing.write_text("#!/bin/sh\necho 'connecting to the bastion' >&2\n"
                       "echo 'bastion: access denied by policy \x1b[31m(code 7)' >&2\nexit 1\n")
    for script in (chatty, failing):
        script.chmod(0o755)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host chatty failing\n    HostName {host.address}\n    Port {host.port}\n"
        f"    User {ssh_lab.user}\n    IdentityFile {ssh_lab.identity_file}\n"
        f"    UserKnownHostsFile {ssh_lab.known_hosts}\n"
        f"Host chatty\n    ProxyCommand {chatty} %h %p\n"
        f"Host failing\n    ProxyCommand {failing} %h %p\n")

    def inventory(alias):
        return write_yaml(tmp_path / f"{alias}.yaml", {
            "defaults": {"python": sys.executable, "ssh_config": str(config)},
            "hosts": [{"name": alias, "address": alias, "workdir": str(host.workdir)}]})

    done = inv("check", "--hosts", str(inventory("chatty")), "--connect-timeout", "20",
               home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    refused = inv("check", "--hosts", str(inventory("failing")), home=home)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    out = " ".join(refused.stdout.split())
    assert ("(the ProxyCommand said: connecting to the bastion | bastion: access denied by "
            "policy \\x1b[31m(code 7))") in out, out
