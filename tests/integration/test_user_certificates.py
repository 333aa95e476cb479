"""OpenSSH user certificates, as organisations issue them (Vault, step-ca, Teleport): a lab host
whose sshd trusts a user CA (TrustedUserCAKeys) and has no authorized key at all, so that only
a certificate signed by that CA logs in. The certificate is kept away from its key and named by
`CertificateFile` in the ssh config, or by the inventory's `certificate_file`; one beside its
key (`<key>-cert.pub`) is offered too. Expired and wrong-principal certificates are refused
with the file and the reason.

The controller runs with HOME set to a directory of the test's own: no key of this machine's
~/.ssh can log in by accident.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asuser import inv_as_user
from sshlab import SshLab


def inv(*args: str, home: Path) -> subprocess.CompletedProcess:
    return inv_as_user(*args, home=home, columns=300)


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True)
    return path


def sign(ca: Path, key: Path, principals: str, validity: str, into: Path) -> Path:
    """A user certificate for `key` signed by `ca`, moved to `into` (away from the key)."""
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "tfdeploy-test", "-n", principals,
                    "-V", validity, f"{key}.pub"], check=True)
    into.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(f"{key}-cert.pub", into)
    return into


@pytest.fixture(scope="module")
def ca_lab(tmp_path_factory):
    """One sshd host that trusts the CA and no authorized key, and the CA itself."""
    base = tmp_path_factory.mktemp("ca-lab")
    ca = keygen(base / "user_ca")
    with SshLab(base / "lab") as lab:
        (host,) = lab.start(1, sshd_options={"AuthorizedKeysFile": "none",
                                             "TrustedUserCAKeys": f"{ca}.pub"})
        yield lab, host, ca


def payload(tmp_path: Path) -> Path:
    path = tmp_path / "payload"
    path.mkdir(exist_ok=True)
    (path / "train.py").write_text("print('trained through a certificate')\n")
    return path


def setup(tmp_path: Path, lab: SshLab, host, config_lines: list[str],
          inventory_fields: dict | None = None) -> tuple[Path, Path]:
    """HOME with an ssh config for the alias `certified`, and an inventory naming it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    config = home / ".ssh" / "config"
    config.write_text("\n".join([
        "Host certified", f"    HostName {host.address}", f"    Port {host.port}",
        f"    User {lab.user}", f"    UserKnownHostsFile {lab.known_hosts}",
        "    IdentitiesOnly yes", *config_lines, ""]))
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"defaults": {"python": sys.executable,
                                                      "ssh_config": str(config)},
                                         "hosts": [{"name": "c1", "address": "certified",
                                                    "workdir": str(host.workdir),
                                                    **(inventory_fields or {})}]}))
    return home, inventory


def test_a_host_that_takes_only_certificates_checks_and_trains_with_certificatefile(
        ca_lab, tmp_path):
    lab, host, ca = ca_lab
    (tmp_path / "keys").mkdir()
    key = keygen(tmp_path / "keys" / "id_ed25519")
    certificate = sign(ca, key, lab.user, "-5m:+1h", tmp_path / "issued" / "alice-cert.pub")

    # The key alone does not log in: the host has no authorized key.
    home, inventory = setup(tmp_path, lab, host, [f"    IdentityFile {key}"])
    refused = inv("check", "--hosts", str(inventory), home=home)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "SSH authentication failed" in refused.stdout, refused.stdout

    home, inventory = setup(tmp_path, lab, host, [f"    IdentityFile {key}",
                                                  f"    CertificateFile {certificate}"])
    shown = inv("hosts", "--hosts", str(inventory), "--json", home=home)
    assert yaml.safe_load(shown.stdout)[0]["certificate_files"] == [str(certificate)]
    checked = inv("check", "--hosts", str(inventory), home=home)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    runs = tmp_path / "runs"
    trained = inv("train", "--hosts", str(inventory), "--payload", str(payload(tmp_path)),
                  "--runs-dir", str(runs), home=home)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    assert "trained through a certificate" in (run_dir / "worker-0.log").read_text()
    assert f"Accepted publickey for {lab.user}" in host.log.read_text()
    assert "ED25519-CERT" in host.log.read_text()


def test_the_inventory_names_the_certificate_and_one_beside_its_key_is_offered(ca_lab,
                                                                                 tmp_path):
    lab, host, ca = ca_lab
    (tmp_path / "keys").mkdir()
    key = keygen(tmp_path / "keys" / "lab_key")
    certificate = sign(ca, key, lab.user, "-5m:+1h", tmp_path / "vault" / "signed.pub")
    home, inventory = setup(tmp_path, lab, host, [], {"identity_file": str(key),
                                                      "certificate_file": str(certificate)})
    checked = inv("check", "--hosts", str(inventory), home=home)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    shutil.move(certificate, f"{key}-cert.pub")          # where ssh-keygen leaves it
    home, inventory = setup(tmp_path, lab, host, [f"    IdentityFile {key}"])
    checked = inv("check", "--hosts", str(inventory), home=home)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("principals, validity, why", [
    ("{user}", "20200101:20200102", "expired at 2020-01-02 00:00:00 UTC"),
    ("{user}", "+1d:+2d", "is not valid before"),
    ("bob,carol", "-5m:+1h", "is for 'bob', 'carol', not '{user}'"),
])
def test_a_certificate_the_host_refuses_is_named_with_its_reason(ca_lab, tmp_path, principals,
                                                                  validity, why):
    lab, host, ca = ca_lab
    (tmp_path / "keys").mkdir()
    key = keygen(tmp_path / "keys" / "id_ed25519")
    certificate = sign(ca, key, principals.format(user=lab.user), validity,
                       tmp_path / "issued" / "cert.pub")
    home, inventory = setup(tmp_path, lab, host, [f"    IdentityFile {key}",
                                                  f"    CertificateFile {certificate}"])
    checked = inv("check", "--hosts", str(inventory), home=home)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    flat = " ".join(checked.stdout.split())
    assert f"c1 (certified = {host.address}): SSH authentication failed as '{lab.user}'" in flat
    assert f"certificate {certificate} {why.format(user=lab.user)}" in flat, flat
