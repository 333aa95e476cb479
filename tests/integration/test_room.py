"""A host without room for the push: the run stops before anything is started, with a line
naming the host and the lack of space, whether the check (free space against the whole push),
the push itself (against exactly what the host's cache lacks) or a disk that fills during the
push finds it. Real sshd hosts on loopback whose workdirs are small tmpfs mounts (root only).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from procs import processes_of_run
from tmpfs import tmpfs


REPO = Path(__file__).resolve().parents[2]
MB = 10 ** 6
# The entry leaves a mark where it is told: it must never have run.
ENTRY = "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('started')\n"


def inv(*args: str) -> subprocess.CompletedProcess:
    # Wide: a problem line and its path are not wrapped.
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, "COLUMNS": "300"})


def big_payload(tmp_path: Path, size: int) -> Path:
    """The entry and a file of `size` bytes (sparse here: zeros, made at once, hashed fast)."""
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(ENTRY)
    with open(payload / "weights.bin", "wb") as f:
        f.truncate(size)
    return payload


def train(inventory: Path, payload: Path, tmp_path: Path, *flags: str):
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(tmp_path / "runs"),
               "--payload", str(payload), "--args", str(tmp_path / "started"), *flags)
    found = re.search(r"run (\d{8}-\d{6}-[0-9a-f]+)", done.stdout)
    assert found, done.stdout + done.stderr
    return done, found.group(1)


def assert_refused_and_nothing_left(done, run_id: str, hosts, tmp_path: Path, words: str):
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Traceback" not in out, out
    assert re.search(words, out), out
    assert not (tmp_path / "started").exists(), "the payload was started"
    assert processes_of_run(run_id) == []
    for host in hosts:
        runs = Path(host.workdir) / "runs"
        assert not runs.exists() or os.listdir(runs) == [], (host.name, os.listdir(runs))


def second_host_on(ssh_lab, tmp_path: Path, mounted: Path):
    """(hosts, inventory): two lab hosts, the second with its workdir on the disk `mounted`."""
    h1, h2 = ssh_lab.hosts[:2]
    hosts = [h1, dataclasses.replace(h2, workdir=mounted / "work")]
    return hosts, ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts)


@pytest.mark.parametrize("disk, size", [("30m", 60 * MB), ("600m", 700 * MB)])
def test_the_check_refuses_a_host_without_room_for_the_push(ssh_lab, tmp_path, disk, size):
    payload = big_payload(tmp_path, size)
    with tmpfs(tmp_path / "disk", disk) as mounted:
        hosts, inventory = second_host_on(ssh_lab, tmp_path, mounted)
        done, run_id = train(inventory, payload, tmp_path)
        need = f"{size / 2 ** 20:.1f} MiB"
        assert_refused_and_nothing_left(
            done, run_id, hosts, tmp_path,
            rf"h2 \(127\.0\.0\.\d+\): [\d.]+ MiB free in {mounted}, this push needs {need}")
        assert "nothing was started" in done.stdout + done.stderr


def test_without_the_check_the_push_refuses_before_sending_a_file(ssh_lab, tmp_path):
    payload = big_payload(tmp_path, 60 * MB)
    with tmpfs(tmp_path / "disk", "30m") as mounted:
        hosts, inventory = second_host_on(ssh_lab, tmp_path, mounted)
        done, run_id = train(inventory, payload, tmp_path, "--no-check")
        assert_refused_and_nothing_left(
            done, run_id, hosts, tmp_path,
            r"h2 \(127\.0\.0\.\d+\): [\d.]+ MiB free in \S+, this push needs 57\.2 MiB")
        assert "no payload file was sent" in done.stdout + done.stderr
        # At most the small files that ride along with the manifest reached the host.
        cached = mounted / "work" / "cache" / "files"
        assert all(p.stat().st_size < 1 << 20 for p in cached.iterdir())


def test_a_disk_that_fills_during_the_push_is_named_and_leaves_nothing(ssh_lab, tmp_path):
    """Two hosts whose workdirs are on one 200 MiB disk: each has room for its own 120 MB
    when asked, not for both pushes together, so one of them fills the disk mid-push. (Without
    the check, whose 512 MiB floor for a run would refuse so small a disk first.)"""
    payload = big_payload(tmp_path, 120 * MB)
    with tmpfs(tmp_path / "disk", "200m") as mounted:
        hosts = [dataclasses.replace(h, workdir=mounted / h.name) for h in ssh_lab.hosts[:2]]
        inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts)
        done, run_id = train(inventory, payload, tmp_path, "--no-check")
        assert_refused_and_nothing_left(
            done, run_id, hosts, tmp_path, rf"no space left on h[12]'s disk in {mounted}/h[12]")


def test_a_disk_too_full_for_the_stage_leaves_no_run_directory(ssh_lab, tmp_path):
    """The push's first write, the stage (run.json, the manifest), finds no room: the run
    directory it began is removed with it."""
    from deploy.push.bundle import manifest_document
    from deploy.push.payload import PayloadPush
    payload = big_payload(tmp_path, 1)
    # Files enough for a manifest that a 16 KiB disk cannot hold.
    for i in range(400):
        (payload / f"part-{i:04d}-of-a-payload-of-many-files.txt").write_text(str(i))
    files = PayloadPush(payload, "train.py", "20260101-000000-abcdef").files
    assert len(json.dumps(manifest_document(files))) > 32 << 10
    with tmpfs(tmp_path / "disk", "16k") as mounted:
        hosts, inventory = second_host_on(ssh_lab, tmp_path, mounted)
        done, run_id = train(inventory, payload, tmp_path, "--no-check")
        assert_refused_and_nothing_left(
            done, run_id, hosts, tmp_path,
            rf"h2 \(127\.0\.0\.\d+\): payload push failed: no space left on the host's disk in "
            rf"{mounted}/work/runs/{run_id}")
