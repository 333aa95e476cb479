"""known_hosts is respected: unknown keys are refused unless accepting is asked for, changed
keys always are, and a refused or unreachable host gets nothing started or written."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from sshlab import SshLab, unreachable_entry


REPO = Path(__file__).resolve().parents[2]


def train(inventory: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(inventory.parent / "runs"), "--args", "--epochs 1 --steps-per-epoch 2", *flags],
        cwd=REPO, text=True, capture_output=True, timeout=300)


def nothing_written(host) -> bool:
    return not (Path(host.workdir) / "runs").exists() or not any(
        (Path(host.workdir) / "runs").iterdir())


@pytest.fixture
def lab(tmp_path):
    with SshLab(tmp_path / "lab") as lab:
        yield lab


def test_unknown_host_key_is_refused_with_its_fingerprint(lab, tmp_path):
    known, unknown = lab.start(1) + lab.start(1, record_host_keys=False)
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [known, unknown])
    done = train(inventory)
    assert done.returncode == 1, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert f"{unknown.name} ({unknown.address}): host key not in" in out
    assert "SHA256:" in out and "--accept-new-host-keys" in out
    assert nothing_written(known) and nothing_written(unknown)
    assert unknown.address not in lab.known_hosts.read_text()


def test_accept_new_records_the_key_and_trains(lab, tmp_path):
    (host,) = lab.start(1, record_host_keys=False)
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [host], workers=2)
    done = train(inventory, "--accept-new-host-keys")
    assert done.returncode == 0, done.stdout + done.stderr
    recorded = paramiko.HostKeys(str(lab.known_hosts)).lookup(f"[{host.address}]:{host.port}")
    assert recorded is not None


def test_changed_host_key_is_always_refused(lab, tmp_path):
    (host,) = lab.start(1)
    other = paramiko.Ed25519Key.from_private_key_file(str(host.identity_file))  # not its key
    lab.known_hosts.write_text(f"[{host.address}]:{host.port} ssh-ed25519 {other.get_base64()}\n")
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [host])
    done = train(inventory, "--accept-new-host-keys")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "HOST KEY CHANGED" in done.stdout
    assert nothing_written(host)


def test_unreachable_host_fails_fast_and_names_it(lab, tmp_path):
    (host,) = lab.start(1)
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", [host], extra=[unreachable_entry()])
    done = train(inventory, "--connect-timeout", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gone (127.0.0.9)" in done.stdout
    assert nothing_written(host)
