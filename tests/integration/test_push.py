"""The incremental payload push on real sshd servers: a second run after a one-file change
sends exactly that file, both runs train, and the hosts keep their file cache."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from procs import wait_until_gone

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TINY = "--epochs 1 --steps-per-epoch 2"


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)


def train(inventory: Path, payload: Path, runs: Path) -> tuple[subprocess.CompletedProcess, dict]:
    before = set(runs.iterdir()) if runs.exists() else set()
    done = inv("train", "--hosts", str(inventory), "--payload", str(payload),
               "--runs-dir", str(runs), "--args", TINY)
    (run_dir,) = set(runs.iterdir()) - before
    assert wait_until_gone(run_dir.name, timeout=5) == []
    return done, json.loads((run_dir / "push.json").read_text())


def test_a_one_file_change_sends_exactly_one_file(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    # Fresh workdirs: other tests' runs must not have filled these hosts' caches already.
    workdirs = {h.name: tmp_path / f"work-{h.name}" for h in hosts}
    inventory = ssh_lab.write_inventory(
        tmp_path / "lab.yaml", hosts,
        per_host={name: {"workdir": str(w)} for name, w in workdirs.items()})
    payload = tmp_path / "payload"
    shutil.copytree(REPO / "payload", payload, ignore=shutil.ignore_patterns("__pycache__"))
    (payload / "notes.txt").write_text("version 1\n")
    (payload / "scratch").mkdir()
    (payload / "scratch" / "big.bin").write_bytes(b"\0" * 100_000)
    (payload / ".tfdeployignore").write_text("# local only\nscratch/\n")
    runs = tmp_path / "runs"

    first, pushed = train(inventory, payload, runs)
    assert first.returncode == 0, first.stdout + first.stderr
    names = sorted([".tfdeployignore", "notes.txt", "requirements.txt", "train.py"])
    assert pushed["files"] == len(names)
    for host in hosts:
        answer = pushed["hosts"][host.name]
        assert len(answer["missing"]) == len(names)            # a fresh host lacks everything
        assert sorted(answer["received"]) == answer["missing"] and answer["files"] == len(names)
    assert f"payload: {len(names)} of {len(names)} file(s) changed" in first.stdout

    (payload / "notes.txt").write_text("version 2\n")
    second, pushed = train(inventory, payload, runs)
    assert second.returncode == 0, second.stdout + second.stderr
    changed = hashlib.sha256(b"version 2\n").hexdigest()
    for host in hosts:
        answer = pushed["hosts"][host.name]
        assert answer["missing"] == [changed] and answer["received"] == [changed]
        assert answer["bytes"] == len("version 2\n")
        # Teardown removed the run dirs but kept the cache: 4 + 1 contents, the ignored file
        # never reached the host.
        work = workdirs[host.name]
        assert sorted(p.name for p in (work / "runs").iterdir()) == []
        cached = sorted(p.name for p in (work / "cache" / "files").iterdir())
        assert len(cached) == len(names) + 1 and changed in cached
        assert list((work / "cache" / "tmp").iterdir()) == []
    assert f"payload: 1 of {len(names)} file(s) changed (10 B) → 2 of 2 host(s)" in second.stdout
    for done in (first, second):
        summary_epochs = [line for line in done.stdout.splitlines() if '"event": "epoch"' in line]
        assert len(summary_epochs) == 2                   # one epoch on each of the two workers
