"""Hosts sharing one workdir under real concurrency: 4 and 8 sshd hosts given one workdir (an
NFS home), runs back to back, every one of which must exit as it should, every time. Every
host unpacks, caches, assembles, joins and leaves the same run directory at the same moment,
so a race between them shows here as a failed run. Loop this file (docs/testing.md): a race
is caught by repetition, not by one pass.

Payloads are tiny scripts (TensorFlow is not the point), so one pass takes a few minutes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_runs import inv, kill_by_records
from test_setup import SSHD_PATH, build_wheel, envs, import_version, other_python
from test_train import REPO, assert_nothing_left

from procs import default_signals, end, processes_of_run
from sshlab import SshLab


SCRIPT = """\
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
files = sum(len(names) for _, _, names in os.walk(os.path.join(here, "files")))
mark = open(os.path.join(here, "mark.txt")).read().strip()
print("task", os.environ["TFDEPLOY_TASK_INDEX"], "mark", mark, "files", files, flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
print("done", flush=True)
"""
WAIT = "--start-timeout", "0", "--no-check", "--grace", "1"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Eight lab hosts on 127.0.0.100 and up, and two more whose `python3` is another build."""
    base = tmp_path_factory.mktemp("stresslab")
    with SshLab(base, first_octet=100) as lab:
        lab.start(8)
        bindir = base / "other-python"
        bindir.mkdir()
        (bindir / "python3").symlink_to(other_python(os.path.realpath(sys.executable)))
        lab.start(2, setenv={"PATH": f"{bindir}:{SSHD_PATH}", "PYENV_VERSION": "system"})
        yield lab


def one_workdir(lab: SshLab, tmp_path: Path, hosts, **fields) -> tuple[Path, list]:
    """An inventory of `hosts` given one workdir of their own; the hosts."""
    shared = lab.sharing_workdir(hosts, name=f"home-{tmp_path.name}")
    return lab.write_inventory(tmp_path / "lab.yaml", shared, **fields), shared


def payload(folder: Path, mark: str, files: int = 0) -> Path:
    """The script, a mark.txt it prints, and `files` small files of distinct content."""
    (folder / "files").mkdir(parents=True)
    (folder / "train.py").write_text(SCRIPT)
    (folder / "mark.txt").write_text(mark + "\n")
    for i in range(files):
        (folder / "files" / f"f{i:04d}.txt").write_text(f"file {i} of {folder.name}\n" * 4)
    return folder


def train_args(inventory: Path, runs: Path, folder: Path, *extra: str) -> list[str]:
    return ["train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
            str(folder), *WAIT, *extra]


def newest(runs: Path) -> Path:
    return max((p for p in runs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime_ns)


def ran(runs: Path, hosts, mark: str, files: int) -> Path:
    """The newest run: every task printed `mark` and saw `files` files, nothing is left of it
    on any host, and the shared workdir holds no run directory and no temporary file."""
    run_dir = newest(runs)
    for task in range(len(hosts)):
        log = (run_dir / f"worker-{task}.log").read_text()
        assert f"task {task} mark {mark} files {files}\n" in log, (task, log)
    assert_nothing_left(run_dir, hosts)
    assert os.listdir(hosts[0].workdir / "runs") == []
    assert os.listdir(hosts[0].workdir / "cache" / "tmp") == []
    assert [p for p in hosts[0].workdir.rglob("*.tmp")] == []
    return run_dir


def train(inventory: Path, runs: Path, folder: Path, *extra: str):
    done = inv(*train_args(inventory, runs, folder, *extra))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def controller(args: list[str]) -> subprocess.Popen:
    """`inv` in the background, SIGINT at its default (a Ctrl-C reaches it)."""
    return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "COLUMNS": "200"}, preexec_fn=default_signals)


def runs_in(runs: Path) -> set[str]:
    return set(os.listdir(runs)) if runs.exists() else set()


def started(runs: Path, earlier: set[str], proc: subprocess.Popen, tasks: int,
            timeout: float = 120) -> str:
    """The id of the run `proc` started (one the runs directory did not hold `earlier`) once
    every task's local log shows its first line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p.parent for p in runs.glob("*/record.json") if p.parent.name not in earlier] \
            if runs.exists() else []
        if found:
            logs = [found[0] / f"worker-{i}.log" for i in range(tasks)]
            if all(p.exists() and "mark" in p.read_text() for p in logs):
                return found[0].name
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    raise AssertionError("the tasks never started")


def test_four_hosts_first_push_of_1000_files_reruns_and_one_change(lab, tmp_path):
    inventory, hosts = one_workdir(lab, tmp_path, lab.hosts[:4])
    runs = tmp_path / "runs"
    folder = payload(tmp_path / "p", "first", files=1000)
    first = train(inventory, runs, folder)
    assert "→ 1 of 4 host(s); 3 host(s) share a workdir with another" in first.stdout
    ran(runs, hosts, "first", 1000)
    for _ in range(3):
        train(inventory, runs, folder)
        ran(runs, hosts, "first", 1000)
    (folder / "files" / "f0500.txt").write_text("changed\n")
    changed = train(inventory, runs, folder)
    assert "payload: 1 of 1002 file(s) changed" in changed.stdout, changed.stdout
    ran(runs, hosts, "first", 1000)


def test_eight_hosts_six_runs_each_after_a_change(lab, tmp_path):
    inventory, hosts = one_workdir(lab, tmp_path, lab.hosts[:8])
    runs = tmp_path / "runs"
    folder = payload(tmp_path / "p", "run0", files=50)
    for run in range(1, 7):
        (folder / "mark.txt").write_text(f"run{run}\n")
        (folder / "files" / f"new{run}.txt").write_text(f"new in run {run}\n")
        train(inventory, runs, folder)
        ran(runs, hosts, f"run{run}", 50 + run)


def worker_of(run_dir: Path, task: int) -> int:
    """The pid of task `task`'s program: its supervisor's child (same process group)."""
    pgid = json.loads((run_dir / f"worker-{task}.pid").read_text())["pgid"]
    found = [p for p in processes_of_run(run_dir.name) if p != pgid and group_of(p) == pgid]
    assert found, f"no program under supervisor {pgid}"
    return found[0]


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def stopped_run(inventory: Path, runs: Path, folder: Path, hosts, stop, code: int) -> str:
    """A run of `folder` (its tasks sleeping) that `stop(run_id, controller)` ends once every
    task has started: the controller's output once it exited with `code`, nothing of the run
    left anywhere."""
    earlier = runs_in(runs)
    proc = controller(train_args(inventory, runs, folder, "--args", "300"))
    run_id = None
    try:
        run_id = started(runs, earlier, proc, len(hosts))
        stop(run_id, proc)
        out = proc.communicate(timeout=120)[0]
        assert proc.returncode == code, out
        assert_nothing_left(runs / run_id, hosts)
        return out
    finally:
        end(proc)
        if run_id:
            kill_by_records(run_id, hosts)


def test_a_worker_killed_mid_run_three_times_each_followed_by_a_good_run(lab, tmp_path):
    inventory, hosts = one_workdir(lab, tmp_path, lab.hosts[:4])
    runs = tmp_path / "runs"
    folder = payload(tmp_path / "p", "kill", files=200)

    def kill_worker_2(run_id: str, _) -> None:
        os.kill(worker_of(hosts[0].workdir / "runs" / run_id, 2), signal.SIGKILL)
    for round_ in range(3):
        (folder / "files" / f"round{round_}.txt").write_text(f"round {round_}\n")
        out = stopped_run(inventory, runs, folder, hosts, kill_worker_2, 1)
        assert "worker-2" in out and "exit code 137" in out, out
        train(inventory, runs, folder)
        ran(runs, hosts, "kill", 201 + round_)


def test_a_run_after_ctrl_c_and_a_run_after_prune(lab, tmp_path):
    inventory, hosts = one_workdir(lab, tmp_path, lab.hosts[:4])
    runs = tmp_path / "runs"
    folder = payload(tmp_path / "p", "again", files=200)
    stopped_run(inventory, runs, folder, hosts,
                lambda _, proc: proc.send_signal(signal.SIGINT), 130)
    train(inventory, runs, folder)
    ran(runs, hosts, "again", 200)
    other = payload(tmp_path / "other", "other", files=100)
    train(inventory, runs, other)
    pruned = inv("prune", "--hosts", str(inventory), "--payload", str(folder), "--runs-dir",
                 str(runs))
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert "h1: freed" in pruned.stdout, pruned.stdout
    train(inventory, runs, other)
    ran(runs, hosts, "other", 100)
    train(inventory, runs, folder)
    ran(runs, hosts, "again", 200)


def test_two_payloads_started_at_the_same_moment_on_the_same_hosts(lab, tmp_path):
    inventory, hosts = one_workdir(lab, tmp_path, lab.hosts[:4])
    runs = {name: tmp_path / f"runs-{name}" for name in ("a", "b")}
    folders = {name: payload(tmp_path / name, f"payload-{name}", files=300) for name in runs}
    procs = {name: controller(train_args(inventory, runs[name], folders[name]))
             for name in runs}
    try:
        outs = {name: proc.communicate(timeout=300)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            end(proc)
    for name, proc in procs.items():
        assert proc.returncode == 0, outs[name]
        run_dir = newest(runs[name])
        for task in range(len(hosts)):
            log = (run_dir / f"worker-{task}.log").read_text()
            assert f"task {task} mark payload-{name} files 300\n" in log, log
        assert_nothing_left(run_dir, hosts)
    assert os.listdir(hosts[0].workdir / "runs") == []


def test_setup_on_four_hosts_builds_one_environment_per_host_key(lab, tmp_path):
    """h1-h3 run one python3, h9 another build (sshd's SetEnv puts it first on its PATH)."""
    wheelhouse = tmp_path / "wheelhouse"
    build_wheel(tmp_path, "1.0", wheelhouse)
    folder = payload(tmp_path / "p", "setup")
    (folder / "requirements.txt").write_text("tinypkg==1.0\n")
    hosts = lab.sharing_workdir([*lab.hosts[:3], lab.hosts[8]], name=f"home-{tmp_path.name}")
    doc = yaml.safe_load(lab.inventory_yaml(hosts))
    del doc["defaults"]["python"]             # each host's own python3
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ("setup", "--hosts", str(inventory), "--payload", str(folder), "--wheelhouse",
            str(wheelhouse))
    done = inv(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "setup: 2 reused, 2 built of 4 host(s)" in done.stdout, done.stdout
    built = envs(hosts[0].workdir)
    assert len(built) == 2 and [import_version(e) for e in built] == ["1.0", "1.0"]
    assert os.listdir(hosts[0].workdir / "runs") == []
    again = inv(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "setup: 4 reused of 4 host(s)" in again.stdout, again.stdout
    assert envs(hosts[0].workdir) == built


RESTARTING = """\
import os, sys, time
task, attempt = os.environ["TFDEPLOY_TASK_INDEX"], os.environ["TFDEPLOY_ATTEMPT"]
state = os.path.join(os.environ["TFDEPLOY_BACKUP_DIR"], "state.txt")
if task == "0" and attempt == "1":
    with open(state, "w") as f:
        f.write("saved by attempt 1")
    print("saved inode", os.stat(state).st_ino, flush=True)
if attempt == "1":
    time.sleep(3 if task == "3" else 300)
    sys.exit(3)
print("task", task, "backup", open(state).read(), "inode", os.stat(state).st_ino, flush=True)
"""


def test_restarts_carry_the_backup_once_per_workdir_and_not_to_the_chiefs(lab, tmp_path):
    """h1 and h2 share one workdir, h3 and h4 another; the chief is on h1. Task 3 fails in
    the first attempt: the backup goes to h3 alone (h4 reads it there), h2 reads the chief's
    own, untouched."""
    hosts = [*lab.sharing_workdir(lab.hosts[:2], name=f"a-{tmp_path.name}"),
             *lab.sharing_workdir(lab.hosts[2:4], name=f"b-{tmp_path.name}")]
    inventory = lab.write_inventory(tmp_path / "lab.yaml", hosts)
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "train.py").write_text(RESTARTING)
    runs = tmp_path / "runs"
    done = train(inventory, runs, folder, "--restarts", "1")
    assert "restart 1 of 1: worker-3 failed (exit code 3)" in done.stdout, done.stdout
    assert "KiB, carried to 1 other workdir(s))" in done.stdout, done.stdout
    run_dir = newest(runs)
    chief_log = (run_dir / "worker-0.log").read_text()
    saved = next(line.split()[-1] for line in chief_log.splitlines()
                 if line.startswith("saved inode "))
    inodes = {}
    for task in range(4):
        log = (run_dir / f"worker-{task}.log").read_text()
        line = next(line for line in log.splitlines() if line.startswith(f"task {task} "))
        assert line.startswith(f"task {task} backup saved by attempt 1 inode "), log
        inodes.setdefault(hosts[task].workdir, set()).add(line.split()[-1])
    # One backup per workdir, read by both of its hosts; the chief's own never rewritten.
    assert [len(found) for found in inodes.values()] == [1, 1]
    assert inodes[hosts[0].workdir] == {saved}
    assert_nothing_left(run_dir, hosts)


DATA = """\
import os
data = os.environ["TFDEPLOY_DATA_DIR"]
print("task", os.environ["TFDEPLOY_TASK_INDEX"], "data", sorted(os.listdir(data)), flush=True)
"""


def test_data_shards_on_a_shared_workdir_are_sent_once_per_tree(lab, tmp_path):
    """h1 and h2 train on shard a, h3 and h4 on shard b, all four in one workdir: each tree
    travels once, each host finds its own."""
    shards = tmp_path / "shards"
    for name in ("a", "b"):
        (shards / name).mkdir(parents=True)
        for i in range(20):
            (shards / name / f"{name}-{i}.txt").write_text(f"shard {name} part {i}\n")
    shared = lab.sharing_workdir(lab.hosts[:4], name=f"home-{tmp_path.name}")
    inventory = lab.write_inventory(tmp_path / "lab.yaml", shared, per_host={
        h.name: {"data": {"local": str(shards / ("a" if i < 2 else "b"))}}
        for i, h in enumerate(shared)})
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "train.py").write_text(DATA)
    runs = tmp_path / "runs"
    outputs = []
    for _ in range(2):
        outputs.append(train(inventory, runs, folder).stdout)
        run_dir = newest(runs)
        for task in range(4):
            shard = "a" if task < 2 else "b"
            log = (run_dir / f"worker-{task}.log").read_text()
            assert f"task {task} data {sorted(f'{shard}-{i}.txt' for i in range(20))}" in log
        assert_nothing_left(run_dir, shared)
        assert os.listdir(shared[0].workdir / "runs") == []
    assert "data: 40 of 40 file(s) new (620 B) → 2 of 4 host(s)" in outputs[0], outputs[0]
    assert "data: 0 of 40 file(s) new" in outputs[1], outputs[1]
    first = json.loads((min(p for p in runs.iterdir() if p.is_dir()) / "data.json").read_text())
    assert {n: h.get("shared_with") for n, h in first["hosts"].items()} == {
        "h1": None, "h2": "h1", "h3": None, "h4": "h3"}
