"""The incremental payload push on real sshd servers: a second run after a one-file change
sends exactly that file, both runs train, and the hosts keep their file cache."""
from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path


from procs import wait_until_gone


REPO = Path(__file__).resolve().parents[2]
TINY = "--epochs 1 --steps-per-epoch 2"


def inv(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300)


def train(inventory: Path, payload: Path, runs: Path) -> tuple[subprocess.CompletedProcess, dict]:
    before = set(runs.iterdir()) if runs.exists() else set()   # run dirs (and the hash memory)
    done = inv("train", "--hosts", str(inventory), "--payload", str(payload),
               "--runs-dir", str(runs), "--args", TINY,
               "--verbose")   # the assertions count raw event lines, which only --verbose shows
    (run_dir,) = {p for p in runs.iterdir() if p.is_dir()} - before
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
    names = sorted([".tfdeployignore", "notes.txt",
                    *(p.name for p in (REPO / "payload").iterdir() if p.is_file())])
    assert pushed["files"] == len(names)
    contents = {hashlib.sha256((payload / n).read_bytes()).hexdigest() for n in names}
    for host in hosts:
        answer = pushed["hosts"][host.name]
        # A fresh host lacks everything; these small new files all rode along with the
        # manifest, so nothing was left missing for a second step.
        assert sorted(answer["received"]) == sorted(contents) and answer["missing"] == []
        assert answer["files"] == len(names)
    assert f"payload: {len(names)} of {len(names)} file(s) changed" in first.stdout
    # Each host's agent kept its compiled code at the push (deploy/host/boot.py), private.
    kept = {}
    for host in hosts:
        [code] = (workdirs[host.name] / "cache" / "agent").iterdir()
        assert code.name.endswith(".code") and stat.S_IMODE(code.stat().st_mode) == 0o600
        kept[code] = code.stat().st_mtime_ns

    (payload / "notes.txt").write_text("version 2\n")
    second, pushed = train(inventory, payload, runs)
    assert second.returncode == 0, second.stdout + second.stderr
    changed = hashlib.sha256(b"version 2\n").hexdigest()
    for host in hosts:
        answer = pushed["hosts"][host.name]
        assert answer["received"] == [changed] and answer["missing"] == []
        # Teardown removed the run dirs but kept the cache: 4 + 1 contents, the ignored file
        # never reached the host.
        work = workdirs[host.name]
        assert sorted(p.name for p in (work / "runs").iterdir()) == []
        cached = sorted(p.name for p in (work / "cache" / "files").iterdir())
        assert len(cached) == len(names) + 1 and changed in cached
        assert list((work / "cache" / "tmp").iterdir()) == []
    # The second run's agents ran that code: none compiled and wrote it again.
    assert {code: code.stat().st_mtime_ns for code in kept} == kept
    assert f"payload: 1 of {len(names)} file(s) changed (10 B) → 2 of 2 host(s)" in second.stdout
    for done in (first, second):
        summary_epochs = [line for line in done.stdout.splitlines() if '"event": "epoch"' in line]
        assert len(summary_epochs) == 2                   # one epoch on each of the two workers


def test_files_too_big_to_ride_along_travel_in_the_second_step(ssh_lab, tmp_path):
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(
        tmp_path / "lab.yaml", hosts,
        per_host={h.name: {"workdir": str(tmp_path / f"work-{h.name}")} for h in hosts})
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text("print('ok')\n")
    (payload / "weights.bin").write_bytes(bytes(range(256)) * 8192)        # 2 MiB
    big = hashlib.sha256((payload / "weights.bin").read_bytes()).hexdigest()
    done, pushed = train(inventory, payload, tmp_path / "runs")
    assert done.returncode == 0, done.stdout + done.stderr
    for host in hosts:
        answer = pushed["hosts"][host.name]
        assert answer["missing"] == [big] and big in answer["received"]
        assert answer["bytes"] == 2 * 1024 * 1024
