"""Two sshd hosts sharing one workdir, as machines sharing an NFS home do: a run pushes once,
keeps each host's tasks apart, leaves nothing readable by others, is refused on a foreign
workdir; `inv prune` frees what no run needs. Payloads are tiny scripts (TensorFlow is not the
point here), so every test takes seconds."""
from __future__ import annotations

import json
import os
import pwd
import re
import stat
from pathlib import Path

import pytest
import test_train
from test_runs import detach, inv, kill_by_records, record, remote_dir
from test_train import assert_nothing_left, only_run

from procs import processes_of_run, wait_for_processes, wait_until_gone


SCRIPT = """\
import os, sys, time
print("task", os.environ["TFDEPLOY_TASK_INDEX"], "of", os.environ["TFDEPLOY_NUM_WORKERS"],
      flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("done", flush=True)
"""


@pytest.fixture
def shared(ssh_lab, tmp_path):
    hosts = ssh_lab.sharing_workdir(ssh_lab.hosts[:2], name=f"shared-{tmp_path.name}")
    assert hosts[0].workdir == hosts[1].workdir
    return ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts), hosts


def payload(folder: Path, **extra: bytes) -> Path:
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    for name, data in extra.items():
        (folder / name).write_bytes(data)
    return folder


def train(inventory: Path, runs: Path, folder: Path, *extra: str):
    return inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(folder), *extra)


def not_private(root: Path) -> list[str]:
    """Every file or directory under `root` (itself included) that group or others may read,
    write or enter."""
    found = []
    for folder, dirs, files in os.walk(root):
        for path in [Path(folder)] + [Path(folder) / n for n in dirs + files]:
            mode = os.lstat(path).st_mode
            if not stat.S_ISLNK(mode) and mode & 0o077:
                found.append(f"{path} {stat.filemode(mode)}")
    return sorted(set(found))


def test_train_pushes_once_per_filesystem_and_leaves_nothing(shared, tmp_path):
    inventory, hosts = shared
    runs = tmp_path / "runs"
    done = train(inventory, runs, payload(tmp_path / "p"), "--args", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run(runs)
    sent = json.loads((run_dir / "push.json").read_text())["hosts"]
    assert sent["h2"]["shared_with"] == "h1" and "shared_with" not in sent["h1"]
    assert "→ 1 of 2 host(s); 1 host(s) share a workdir with another" in done.stdout
    for task in (0, 1):
        assert f"task {task} of 2" in (run_dir / f"worker-{task}.log").read_text()
    assert_nothing_left(run_dir, hosts)
    assert os.listdir(hosts[0].workdir / "runs") == []


def test_two_detached_runs_side_by_side_private_and_stopped_one_by_one(shared, tmp_path):
    inventory, hosts = shared
    runs = tmp_path / "runs"
    folder = payload(tmp_path / "p")
    long = ("--payload", str(folder), "--args", "300", "--grace", "1", "--no-check")
    a = b = None
    try:
        a = detach(inventory, runs, *long)
        b = detach(inventory, runs, *long)
        # Each run: two tasks, each under its supervisor, all alive.
        assert len(wait_for_processes(a, 4)) >= 4 and len(wait_for_processes(b, 4)) >= 4
        for run_id in (a, b):
            members = sorted(os.listdir(remote_dir(hosts[0], run_id) / "hosts"))
            assert members == ["h1.json", "h2.json"]
        assert not_private(hosts[0].workdir) == []
        assert not_private(runs) == []
        b_procs = processes_of_run(b)
        down = inv("down", "--run", a, "--runs-dir", str(runs))
        assert down.returncode == 0, down.stdout + down.stderr
        assert record(runs, a)["state"] == "down"
        assert_nothing_left(runs / a, hosts)
        assert set(b_procs) <= set(processes_of_run(b)), "B's tasks live on"
        assert (remote_dir(hosts[0], b) / "payload" / "train.py").exists()
        down_b = inv("down", "--run", b, "--runs-dir", str(runs))
        assert down_b.returncode == 0, down_b.stdout + down_b.stderr
        assert_nothing_left(runs / b, hosts)
        assert os.listdir(hosts[0].workdir / "runs") == []
    finally:
        for run_id in (a, b):
            if run_id:
                kill_by_records(run_id, hosts)


def test_a_workdir_of_another_user_open_to_all_is_refused(ssh_lab, tmp_path):
    nobody = pwd.getpwnam("nobody")
    workdir = tmp_path / "foreign"
    workdir.mkdir()
    os.chown(workdir, nobody.pw_uid, nobody.pw_gid)
    workdir.chmod(0o777)
    hosts = ssh_lab.hosts[:2]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, workdir=str(workdir))
    check = _inv_wide("check", "--hosts", str(inventory))
    assert check.returncode == 1, check.stdout + check.stderr
    for host in ("h1", "h2"):
        assert re.search(rf"{host}\b.*unsafe workdir {re.escape(str(workdir))}: owned by "
                         rf"nobody, mode 0777", check.stdout), check.stdout
    # Without the checks, the push refuses it before writing anything.
    runs = tmp_path / "runs"
    done = _inv_wide("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
                     str(payload(tmp_path / "p")), "--no-check")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"unsafe workdir {workdir}: owned by nobody, mode 0777" in done.stdout
    assert os.listdir(workdir) == []
    assert wait_until_gone(only_run(runs).name, timeout=5) == []


def _inv_wide(*args: str):
    """`inv` with room for a whole problem on one line of a table."""
    return test_train.inv(*args, env={**os.environ, "COLUMNS": "1000"})


def cache_bytes(workdir: Path) -> dict[str, int]:
    files = workdir / "cache" / "files"
    return {p.name: p.stat().st_size for p in files.iterdir()} if files.exists() else {}


def everything(root: Path) -> dict[str, int]:
    return {str(p): p.lstat().st_size for p in root.rglob("*")}


def test_prune_frees_what_only_an_old_payload_needed(shared, tmp_path):
    inventory, hosts = shared
    workdir = hosts[0].workdir
    runs = tmp_path / "runs"
    a = payload(tmp_path / "a")
    b = payload(tmp_path / "b", **{"weights.bin": os.urandom(8 << 20)})
    for folder in (a, b):
        done = train(inventory, runs, folder, "--no-check")
        assert done.returncode == 0, done.stdout + done.stderr
    before = everything(workdir)
    dry = inv("prune", "--hosts", str(inventory), "--payload", str(a), "--runs-dir", str(runs),
              "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "h1: would free" in dry.stdout and "nothing was deleted" in dry.stdout
    assert everything(workdir) == before
    cached = cache_bytes(workdir)
    pruned = inv("prune", "--hosts", str(inventory), "--payload", str(a), "--runs-dir",
                 str(runs))
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert "h1: freed" in pruned.stdout and "h2: freed" in pruned.stdout
    freed = sum(cached.values()) - sum(cache_bytes(workdir).values())
    assert freed >= 7 << 20, pruned.stdout
    assert set(cache_bytes(workdir)) < set(cached)
    again = train(inventory, runs, a, "--no-check")
    assert again.returncode == 0, again.stdout + again.stderr
    newest = max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    sent = json.loads((newest / "push.json").read_text())["hosts"]
    assert sent["h1"]["missing"] == [], "A's files stayed in the cache"
    assert wait_until_gone(newest.name, timeout=5) == []
