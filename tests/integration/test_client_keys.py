"""Client keys as users have them: a 3072-bit RSA key (ssh-keygen's default type for years,
still many users' `~/.ssh/id_rsa`), named in the inventory or found as `~/.ssh/id_rsa` with
no key configured, logs in to every host of a run, all of them with the one key loaded once
(deploy/transport/keyfiles.py)."""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from deploy.inventory.load import load_inventory
from deploy.transport import keyfiles
from deploy.transport.connect import connect
from asuser import inv_as_user
from deploy.transport.filecache import ParsedFiles
from sshlab import SshLab


@pytest.fixture(scope="module")
def rsa_lab(tmp_path_factory):
    with SshLab(tmp_path_factory.mktemp("rsa") / "lab", key_type="rsa") as lab:
        yield lab


def check(inventory: Path, home: Path) -> subprocess.CompletedProcess:
    # No ssh-agent: the key files alone log in.
    return inv_as_user("check", "--hosts", str(inventory), home=home, columns=300)


def test_an_rsa_key_named_in_the_inventory_logs_in_to_every_host(rsa_lab, tmp_path):
    hosts = rsa_lab.start(4)
    assert "BEGIN OPENSSH PRIVATE KEY" in rsa_lab.identity_file.read_text()
    assert rsa_lab.identity_file.name == "id_rsa"
    inventory = rsa_lab.write_inventory(tmp_path / "hosts.yaml", hosts)
    done = check(inventory, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "│" in line]
    assert all(any(f" {h.name} " in row and f" {h.address} " in row for row in rows)
               for h in hosts)


def test_the_default_id_rsa_logs_in_where_no_key_is_configured(rsa_lab, tmp_path):
    hosts = rsa_lab.start(2)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(rsa_lab.identity_file, home / ".ssh" / "id_rsa")
    (home / ".ssh" / "id_rsa").chmod(0o600)
    inventory = yaml.safe_load(rsa_lab.inventory_yaml(hosts))
    del inventory["defaults"]["identity_file"]
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(inventory))
    done = check(path, home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout


def test_the_logins_of_many_hosts_load_the_key_file_once(rsa_lab, tmp_path, monkeypatch):
    """In this process, as a run's logins are: all at once, each with the key named."""
    loaded = []
    load = keyfiles._load
    monkeypatch.setattr(keyfiles, "_KEYS", ParsedFiles(
        lambda path, data, kind: loaded.append((path, kind.__name__)) or load(path, data, kind)))
    hosts = rsa_lab.start(4)
    inventory = load_inventory(rsa_lab.write_inventory(tmp_path / "hosts.yaml", hosts))
    transports = []
    try:
        with ThreadPoolExecutor(len(hosts)) as pool:
            for transport in pool.map(connect, inventory.hosts):
                transports.append(transport)
        assert all(t.run("true").code == 0 for t in transports)
    finally:
        for transport in transports:
            transport.close()
    assert loaded == [(str(rsa_lab.identity_file), "RSAKey")]
