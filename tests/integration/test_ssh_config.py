"""SSH as users have it, against real sshd servers: hosts known only by their ssh-config
aliases, keys from an ssh-agent the test starts, and hosts on a LAN that only a gateway
reaches (network namespaces), training end to end through `jump:`.

The controller runs with HOME set to a directory of the test's own, so neither this machine's
~/.ssh/config nor a key in ~/.ssh/id_* can make a test pass by accident.
"""
from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from netlan import GatewayLan
from netns import NetnsUnavailable

from asuser import inv_as_user as inv
from procs import wait_until_gone
from sshlab import SshLab


QUICK = "--epochs 2 --steps-per-epoch 5"


def shown_user(user: str) -> str:
    """How a login names its user: not at all when it is the local account's."""
    return "" if user == pwd.getpwuid(os.getuid()).pw_name else f"{user}@"


def flat(text: str) -> str:
    return " ".join(text.split())


def empty_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def only_run(runs: Path) -> Path:
    found = [p for p in runs.iterdir() if p.is_dir()]
    assert len(found) == 1, found
    return found[0]


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def train(inventory: Path, runs: Path, home: Path) -> Path:
    """`inv train` of the quick payload run, which must exit 0; its local run directory."""
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args", QUICK,
               home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    return only_run(runs)


def assert_trained_and_gone(run_dir: Path, hosts) -> dict:
    record = json.loads((run_dir / "record.json").read_text())
    assert record["state"] == "finished" and record["exit_code"] == 0
    for i in range(len(record["tasks"])):
        log = (run_dir / f"worker-{i}.log").read_text()
        assert '"epoch": 2, "loss"' in log, log[-2000:]
    assert wait_until_gone(record["run_id"], timeout=5) == []
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / record["run_id"]).exists(), host
    return record


# ---- (a) hosts known only by their ssh-config aliases ------------------------------------------

def alias_config(lab: SshLab, hosts, home: Path) -> None:
    """~/.ssh/config (under the test's HOME) that includes one file per host, as many people
    keep theirs: HostName, User, Port, IdentityFile, UserKnownHostsFile from the config only."""
    ssh = home / ".ssh"
    (ssh / "config.d").mkdir(parents=True)
    # Absolute: ssh resolves a relative Include against the account's ~/.ssh, not $HOME's.
    (ssh / "config").write_text(f"Include {ssh}/config.d/*.conf\n\nHost *\n"
                                "    ServerAliveInterval 30\n")
    for host in hosts:
        (ssh / "config.d" / f"{host.name}.conf").write_text(
            f"Host lab-{host.name}\n    HostName {host.address}\n    Port {host.port}\n"
            f"    User {lab.user}\n    IdentityFile {lab.identity_file}\n"
            f"    UserKnownHostsFile {lab.known_hosts}\n")


def alias_inventory(path: Path, hosts) -> Path:
    return write_yaml(path, {"defaults": {"python": sys.executable}, "hosts": [
        {"name": h.name, "address": f"lab-{h.name}", "workdir": str(h.workdir)} for h in hosts]})


def test_hosts_known_by_ssh_config_alias_check_and_train(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    home = empty_home(tmp_path)
    alias_config(ssh_lab, hosts, home)
    inventory = alias_inventory(tmp_path / "aliases.yaml", hosts)

    plan = inv("train", "--hosts", str(inventory), "--dry-run", home=home)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    for host in hosts:
        # The login as resolved, and the cluster address is the HostName, not the alias.
        # (`ssh -G` names a user in any case: the local account's name is left unsaid.)
        assert (f"ssh {shown_user(ssh_lab.user)}{host.address}:{host.port} "
                f"(alias lab-{host.name})" in plan.stdout)
    assert "lab-h" not in plan.stdout.split("cluster: ")[1].splitlines()[0]

    done = inv("check", "--hosts", str(inventory), home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lab-{hosts[0].name} (cluster {hosts[0].address})" in done.stdout

    record = assert_trained_and_gone(train(inventory, tmp_path / "runs", home), hosts)
    assert [t["endpoint"].rsplit(":", 1)[0] for t in record["tasks"]] == [
        h.address for h in hosts]
    # The record keeps the resolved login: a reattach does not depend on the config file.
    assert [(h["target"]["hostname"], h["target"]["port"]) for h in record["hosts"]] == [
        (h.address, h.port) for h in hosts]


def test_an_alias_whose_key_is_unknown_is_refused_at_its_hostname_and_port(tmp_path):
    """known_hosts is looked up as OpenSSH does, by [HostName]:Port, not by the alias."""
    home = empty_home(tmp_path)
    with SshLab(tmp_path / "lab", first_octet=70) as lab:
        (host,) = lab.start(1, record_host_keys=False)
        alias_config(lab, [host], home)
        inventory = alias_inventory(tmp_path / "aliases.yaml", [host])
        done = inv("check", "--hosts", str(inventory), home=home)
        out = flat(done.stdout)
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"{host.name} (lab-{host.name} = {host.address}): host key not in" in out
        assert f"ssh-keyscan -p {host.port} {host.address} >> {lab.known_hosts}" in out
        # Once its key is in known_hosts under [HostName]:Port, the alias connects.
        with open(lab.known_hosts, "a") as f:
            f.write(host.known_hosts_line())
        done = inv("check", "--hosts", str(inventory), home=home)
        assert done.returncode == 0, done.stdout + done.stderr


# ---- (b) keys from an ssh-agent ------------------------------------------------------------

@pytest.fixture
def agent(tmp_path):
    """An ssh-agent of the test's own (ended by its pid), and a function that adds a key."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.05)

        def add(key: Path) -> None:
            subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, timeout=20,
                           env={"SSH_AUTH_SOCK": str(sock), "PATH": "/usr/bin:/bin"})
        yield str(sock), add
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_keys_from_the_ssh_agent_and_only_from_it(ssh_lab, agent, tmp_path):
    sock, add = agent
    home = empty_home(tmp_path)
    hosts = ssh_lab.hosts[:2]
    # No identity_file anywhere, no ssh config, and no ~/.ssh/id_* in this HOME.
    inventory = write_yaml(tmp_path / "agent.yaml", {
        "defaults": {"known_hosts": str(ssh_lab.known_hosts), "user": ssh_lab.user,
                     "python": sys.executable},
        "hosts": [{"name": h.name, "address": h.address, "port": h.port,
                   "workdir": str(h.workdir)} for h in hosts]})
    assert not (home / ".ssh").exists()

    without = inv("check", "--hosts", str(inventory), home=home)
    assert without.returncode == 1, without.stdout + without.stderr
    assert "SSH authentication failed" in flat(without.stdout)

    empty_agent = inv("check", "--hosts", str(inventory), home=home, agent=sock)
    assert empty_agent.returncode == 1, empty_agent.stdout + empty_agent.stderr
    assert (f"{hosts[0].name} ({hosts[0].address}): SSH authentication failed as "
            f"'{ssh_lab.user}': no key to offer" in flat(empty_agent.stdout))

    add(ssh_lab.identity_file)
    done = inv("check", "--hosts", str(inventory), home=home, agent=sock)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout


# ---- (c) hosts behind a gateway ------------------------------------------------------------

def reachable(address: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture
def gateway_lab(tmp_path):
    """sshd on a gateway namespace and on two LAN hosts behind it: (lan, lab, gateway, hosts).
    Checked first: this machine reaches the gateway's sshd and not the hosts'."""
    try:
        with GatewayLan(hosts=2) as lan, SshLab(tmp_path / "lab") as lab:
            gw = lab.start_in_netns(lan.gw, lan.gw_address)
            hosts = [lab.start_in_netns(ns, address, reachable=False)
                     for ns, address in zip(lan.lan_ns, lan.host_addresses)]
            lan.check_exists()
            assert reachable(gw.address, gw.port)
            for host in hosts:
                assert not reachable(host.address, host.port), f"{host.address} is reachable"
            yield lan, lab, gw, hosts
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))


def test_hosts_behind_a_gateway_train_directly_with_each_other(gateway_lab, tmp_path):
    lan, lab, gw, hosts = gateway_lab
    home = empty_home(tmp_path)
    jump = f"{lab.user}@{gw.address}:{gw.port}"
    inventory = lab.write_inventory(tmp_path / "lan.yaml", hosts, jump=jump,
                                    ssh_config="none")
    plan = inv("train", "--hosts", str(inventory), "--dry-run", home=home)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"ssh {lab.user}@{hosts[0].address}:{hosts[0].port} via {jump}" in plan.stdout

    runs = tmp_path / "runs"
    run_dir = train(inventory, runs, home)
    record = assert_trained_and_gone(run_dir, hosts)
    # TF_CONFIG names the hosts' LAN addresses: training traffic goes between the hosts,
    # across the LAN, not through the gateway (which does not forward anyway).
    cluster = json.loads((run_dir / "plan.json").read_text())["hosts"][0]["tasks"][0][
        "tf_config"]["cluster"]["worker"]
    assert [w.rsplit(":", 1)[0] for w in cluster] == lan.host_addresses
    assert [t["endpoint"] for t in record["tasks"]] == cluster
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["losses_agree"], summary
    # The SSH sessions came from the gateway's LAN address.
    for host in hosts:
        assert f"Connection from {lan.gw_lan} port" in host.log.read_text()

    # A reattaching controller reaches the run through the recorded gateway.
    detached = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--args",
                   "--epochs 50 --steps-per-epoch 5", "--detach", home=home)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    run_id = next(p.name for p in runs.iterdir() if p.is_dir() and p != run_dir)
    status = inv("status", "--runs-dir", str(runs), "--run", run_id, home=home)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "running" in status.stdout
    down = inv("down", "--runs-dir", str(runs), "--run", run_id, home=home)
    assert down.returncode == 0, down.stdout + down.stderr
    assert wait_until_gone(run_id, timeout=5) == []


def test_proxyjump_in_ssh_config_and_errors_that_name_the_hop(gateway_lab, tmp_path):
    lan, lab, gw, hosts = gateway_lab
    home = empty_home(tmp_path)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gateway\n    HostName {gw.address}\n    Port {gw.port}\n"
        f"Host lan-*\n    ProxyJump gateway\n    Port {hosts[0].port}\n"
        + "".join(f"Host lan-{h.name}\n    HostName {h.address}\n" for h in hosts)
        + f"Host *\n    User {lab.user}\n    IdentityFile {lab.identity_file}\n"
        f"    UserKnownHostsFile {lab.known_hosts}\n")
    inventory = write_yaml(tmp_path / "lan.yaml", {
        "defaults": {"python": sys.executable, "ssh_config": str(config)},
        "hosts": [{"name": h.name, "address": f"lan-{h.name}", "workdir": str(h.workdir)}
                  for h in hosts]})
    logins = gw.log.read_text().count("Accepted publickey")
    done = inv("check", "--hosts", str(inventory), home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"lan-{hosts[0].name} (cluster {hosts[0].address}) via gateway" in done.stdout
    # Both hosts' sessions went over one login to the gateway.
    assert gw.log.read_text().count("Accepted publickey") - logins == 1

    # The gateway's host key is checked like the host's: unknown to this known_hosts,
    # it is refused (never added silently), and the message names the gateway.
    bare = tmp_path / "known_hosts_without_gateway"
    bare.write_text("".join(h.known_hosts_line() for h in hosts))
    config.write_text(config.read_text().replace(str(lab.known_hosts), str(bare)))
    done = inv("check", "--hosts", str(inventory), home=home)
    out = flat(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"{hosts[0].name} (lan-{hosts[0].name} = {hosts[0].address} via gateway): "
            f"gateway gateway ({shown_user(lab.user)}{gw.address}:{gw.port}): host key not in "
            f"{bare}"
            in out), out
    assert bare.read_text().count("\n") == len(hosts)
    # A host's key unknown behind a known gateway: refused, with a keyscan run on the gateway.
    gateway_only = tmp_path / "known_hosts_gateway_only"
    gateway_only.write_text(gw.known_hosts_line())
    config.write_text(config.read_text().replace(str(bare), str(gateway_only)))
    out = flat(inv("check", "--hosts", str(inventory), home=home).stdout)
    assert (f"{hosts[0].name} (lan-{hosts[0].name} = {hosts[0].address} via gateway): host key "
            f"not in {gateway_only}" in out), out
    assert (f"ssh ssh://{lab.user}@{gw.address}:{gw.port} ssh-keyscan -p {hosts[0].port} "
            f"{hosts[0].address} >> {gateway_only}" in out), out

    # A LAN address where nothing is: the gateway is reached, the host is not.
    nobody = lan.host_addresses[-1].rsplit(".", 1)[0] + ".200"
    stray = write_yaml(tmp_path / "stray.yaml", {
        "defaults": {"python": sys.executable, "ssh_config": "none",
                     "known_hosts": str(lab.known_hosts),
                     "identity_file": str(lab.identity_file)},
        "hosts": [{"name": "stray", "address": nobody, "port": gw.port,
                   "jump": f"{gw.address}:{gw.port}", "workdir": str(tmp_path / "w")}]})
    done = inv("check", "--hosts", str(stray), "--connect-timeout", "5", home=home)
    out = flat(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"stray ({nobody} via {gw.address}:{gw.port}): gateway {gw.address}:{gw.port}: "
            f"cannot reach {nobody}:{gw.port} from there" in out), out
