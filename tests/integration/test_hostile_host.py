"""A compromised host cannot harm the controller, nor the other hosts: two SSH lab hosts, of
which h1 (the chief) runs a tampered Python (tests/tampered.py) whose agent adds hostile
members to the archives it makes, sends frames of a gigabyte, and reports task states that are
terminal escape sequences. No file outside runs/<id>/ changes, no link under runs/ leads out
of it, the controller's memory stays small, escapes are shown escaped, and no traceback.
Also: another user's link as a workdir, and what a local task sees of the controller's
environment. Small scripts as payloads (no TensorFlow)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_runs import detach, kill_by_records
from test_train import REPO, assert_nothing_left, only_run

import hostile
from tampered import ESCAPE_STATE, TamperedPython


# Epoch events, an output file, a backup file; task 1 fails once on the first attempt, when
# the test asks (for --restarts); every task waits for a stop when the test asks (--detach).
SCRIPT = """\
import json, os, sys, time
out, backup = os.environ["TFDEPLOY_OUTPUT_DIR"], os.environ.get("TFDEPLOY_BACKUP_DIR")
task, attempt = os.environ["TFDEPLOY_TASK_INDEX"], os.environ.get("TFDEPLOY_ATTEMPT", "1")
print(json.dumps({"event": "start", "epochs": 2}), flush=True)
with open(os.path.join(out, "model-%s.txt" % task), "w") as f:
    f.write("weights")
if backup:
    with open(os.path.join(backup, "state"), "w") as f:
        f.write("epoch 1")
for epoch in (1, 2):
    print(json.dumps({"event": "epoch", "epoch": epoch, "loss": 1.0 / epoch}), flush=True)
    time.sleep(0.2)
if "--crash-once" in sys.argv and task == "1" and attempt == "1":
    time.sleep(1)
    sys.exit(3)
if "--wait" in sys.argv:
    time.sleep(120)
"""
WAITING = ("--no-check", "--grace", "1", "--args", "--wait")
# A controller under this reports its peak resident memory (its own and its children's).
MEASURED = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
            "print('peak RSS KiB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
            "file=sys.stderr); sys.exit(done.returncode)")


@pytest.fixture
def lab(ssh_lab, tmp_path):
    """(inventory, hosts, tampered python of h1, runs dir, victim directory)."""
    hosts = ssh_lab.hosts[:2]
    runs, victim = tmp_path / "runs", tmp_path / "victim"
    victim.mkdir()
    (victim / "flag").write_text("original")
    python = TamperedPython(tmp_path / "tampered", runs_dir=runs, victim=victim,
                            backup_dest=hosts[1].workdir, bomb=tmp_path / "bomb.tar.gz")
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts,
                                        per_host={"h1": {"python": str(python.python)}})
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(SCRIPT)
    return inventory, hosts, python, runs, victim, payload


def inv(*args: str, measured: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    prefix = [sys.executable, "-c", MEASURED] if measured else []
    return subprocess.run([*prefix, sys.executable, "-m", "invoke", *args], cwd=REPO,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def train(lab, *extra: str, measured: bool = False) -> subprocess.CompletedProcess:
    inventory, _, _, runs, _, payload = lab
    return inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--no-check", "--grace", "1", *extra, measured=measured)


def text(done: subprocess.CompletedProcess) -> str:
    out = (done.stdout + done.stderr).decode("utf-8", "replace")
    assert "Traceback" not in out, out
    # Piped, rich prints no styling: every ESC would be the host's.
    assert b"\x1b" not in done.stdout + done.stderr, out
    return out


def files_under(root: Path, leave_out: Path | None = None) -> dict[str, bytes | str]:
    """Every path under `root` but `leave_out`: a file's bytes, a link's target."""
    found: dict[str, bytes | str] = {}
    for top, dirs, names in os.walk(root):
        if leave_out is not None and Path(top) == leave_out.parent:
            dirs[:] = [d for d in dirs if Path(top) / d != leave_out]
        for name in dirs + names:
            path = Path(top) / name
            if path.is_symlink():
                found[str(path)] = os.readlink(path)
            elif path.is_file():
                found[str(path)] = path.read_bytes()
    return found


def links_stay_inside(runs: Path, run_dir: Path) -> None:
    for top, dirs, names in os.walk(runs):
        for name in dirs + names:
            path = Path(top) / name
            if path.is_symlink():
                assert path.resolve().is_relative_to(run_dir.resolve()), (path, path.resolve())


def peak_rss_mib(done: subprocess.CompletedProcess) -> float:
    kib = int(re.search(rb"peak RSS KiB (\d+)", done.stderr).group(1))
    return kib / 1024


def test_hostile_members_of_the_chiefs_output_change_nothing_outside_the_run(lab):
    inventory, hosts, python, runs, victim, payload = lab
    python.set("archive")
    runs.mkdir()
    (runs / "other-file").write_text("kept")
    before = {"victim": files_under(victim), "around": files_under(victim.parent, runs)}
    done = train(lab)
    out = text(done)
    run_dir = only_run(runs)
    try:
        # Training went well; what the host added was left out, each member named.
        assert done.returncode == 0, out
        assert (run_dir / "artifacts" / "model-0.txt").read_text() == "weights"
        for member, why in (("a", "a symbolic link"), ("escape", "a symbolic link"),
                            ("flaglink", "a hard link")):
            assert f"h1 (127.0.0.2): skipped {member!r} of the chief's output: {why}" in out
        # The first 20 by name, the rest (a device, a fifo...) counted.
        assert "h1 (127.0.0.2): skipped 7 more member(s) of the chief's output" in out
        assert files_under(victim) == before["victim"]
        after = files_under(victim.parent, runs)
        # The tool's own file beside the runs (hashes of the payload) aside.
        after.pop(str(runs / "payload-hashes.json"), None)
        before["around"].pop(str(runs / "payload-hashes.json"), None)
        assert after == before["around"]
        links_stay_inside(runs, run_dir)
        for top, _, names in os.walk(run_dir / "artifacts"):
            assert not any((Path(top) / n).is_symlink() for n in names)
        assert not list(Path("/tmp").glob("tfdeploy-absolute-*"))
    finally:
        kill_by_records(run_dir.name, hosts)
    assert_nothing_left(run_dir, hosts)


def test_hostile_members_of_the_chiefs_backup_are_refused_by_the_controller(lab):
    """The chief's backup, copied after each epoch and carried to h2 by --restarts, holds
    the hostile members aimed at the victim from h2's backup directory, each listed as one of
    the backup's files: the controller refuses the copy, naming the host and the first name
    that is not plain, keeps nothing of it and carries nothing; the restart fails on it. (A
    backup that did reach h2 would be unpacked there as archive.py unpacks: test_archive.)"""
    inventory, hosts, python, runs, victim, payload = lab
    python.set("backup")
    before = files_under(victim)
    done = train(lab, "--restarts", "1", "--args", "--crash-once")
    out = " ".join(text(done).split())
    run_dir = only_run(runs)
    try:
        assert done.returncode == 1, out
        assert "restart 1 of 1: worker-1 failed (exit code 3)" in out
        assert re.search(r"error: h1 \(127\.0\.0\.2\): the chief's backup refused: its [\d.]+ "
                         r"KiB archive: it lists '(\.\./)+[^']*/dotdot', not a plain "
                         r"relative name", out), out
        assert files_under(victim) == before
        assert not (run_dir / "backup" / "chief.tar.gz").exists()
    finally:
        kill_by_records(run_dir.name, hosts)
    assert_nothing_left(run_dir, hosts)


def test_an_archive_that_would_unpack_past_the_limit_is_refused_naming_host_and_sizes(lab):
    inventory, hosts, python, runs, victim, payload = lab
    Path(python.folder.parent / "bomb.tar.gz").write_bytes(hostile.gzip_bomb(2 << 30))
    python.set("bomb")
    done = train(lab, "--max-fetch", "1GiB")
    out = text(done)
    run_dir = only_run(runs)
    try:
        assert done.returncode == 1, out
        assert ("fetching artifacts: h1 (127.0.0.2): the chief's output refused: its 2.0 MiB "
                "archive: it would unpack to more than 1.0 GiB (the limit); --max-fetch "
                "raises it") in " ".join(out.split())
        assert not (run_dir / "artifacts").exists() or not os.listdir(run_dir / "artifacts")
        assert json.loads((run_dir / "record.json").read_text())["state"] == "finished"
        assert os.listdir(run_dir) and not [p for p in run_dir.iterdir()
                                            if p.name.startswith("tmp")]
    finally:
        kill_by_records(run_dir.name, hosts)
    assert_nothing_left(run_dir, hosts)


def test_the_controllers_memory_stays_small_under_frames_of_a_gigabyte(lab):
    """A heartbeat that announces a gigabyte is refused before a byte of it is read; an
    archive of a gigabyte goes to a file on disk, never into memory, and is refused there."""
    inventory, hosts, python, runs, victim, payload = lab
    python.set("beat")
    done = train(lab, "--args", "--wait", measured=True)
    out = text(done)
    beat = peak_rss_mib(done)
    run_dir = only_run(runs)
    print(f"controller peak RSS under a 1 GiB heartbeat: {beat:.0f} MiB")
    try:
        assert done.returncode == 1, out
        assert ("h1 (127.0.0.2): bad length in frame header: a body of 1073741824 bytes, more "
                "than the 0 allowed") in " ".join(out.split()), out
        assert beat < 400, out
    finally:
        kill_by_records(run_dir.name, hosts)
        for p in list(runs.iterdir()):
            subprocess.run(["rm", "-rf", str(p)], check=False)

    python.set()
    run_id = detach(inventory, runs, "--payload", str(payload), *WAITING)
    try:
        python.set("big")
        down = inv("down", "--run", run_id, "--runs-dir", str(runs), measured=True)
        out = text(down)
        big = peak_rss_mib(down)
        print(f"controller peak RSS under a 1 GiB archive answer: {big:.0f} MiB")
        assert down.returncode == 1, out
        assert "the chief's output refused: its 1.0 GiB archive: not a tar.gz" in \
            " ".join(out.split()), out
        assert big < 400, out
        assert not [p for p in (runs / run_id).iterdir() if p.name.startswith("tmp")]
    finally:
        python.set()
        kill_by_records(run_id, hosts)


def test_escapes_in_a_hosts_task_states_are_shown_escaped(lab):
    """In `inv status` and in a run's end: the answer is refused, naming the host and the
    field, with the state as the visible escapes it is; teardown, summary and record still
    complete, and no ESC byte reaches the terminal."""
    inventory, hosts, python, runs, victim, payload = lab
    shown = repr(ESCAPE_STATE)       # '\x1b]52;c;dGZkZXBsb3k=\x1b\\'
    python.set("state")
    done = train(lab)
    out = " ".join(text(done).split())
    run_dir = only_run(runs)
    try:
        assert done.returncode == 1, out
        assert (f"error: h1: following the run: bad answer to follow: tasks.0.state is not one "
                f"of pending, running, exited, lost: {shown}") in out
        assert "summary" in out and (run_dir / "summary.json").exists()
        record = json.loads((run_dir / "record.json").read_text())
        assert (record["state"], record["exit_code"]) == ("finished", 1)
    finally:
        kill_by_records(run_dir.name, hosts)
    assert_nothing_left(run_dir, hosts)

    python.set()
    run_id = detach(inventory, runs, "--payload", str(payload), *WAITING)
    try:
        python.set("state")
        status = inv("status", "--run", run_id, "--runs-dir", str(runs))
        out = " ".join(text(status).split())
        assert status.returncode == 1, out
        assert (f"h1 (127.0.0.2): poll failed: bad answer to poll: tasks.0.state is not one of "
                f"pending, running, exited, lost: {shown}") in out
        down = inv("down", "--run", run_id, "--runs-dir", str(runs))
        assert down.returncode == 0, text(down)
    finally:
        python.set()
        kill_by_records(run_id, hosts)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a link to nobody")
def test_a_workdir_that_is_another_users_link_in_a_sticky_directory_is_refused(ssh_lab,
                                                                              tmp_path):
    """/tmp-like: open to all, sticky. nobody's link there leads to a directory of ours;
    `inv check`, `inv train` and `inv setup` refuse it, naming it, and write nothing there."""
    workdir, target = hostile.foreign_link(tmp_path)
    hosts = ssh_lab.hosts[:1]
    inventory = ssh_lab.write_inventory(tmp_path / "lab.yaml", hosts, workdir=str(workdir))
    named = f"unsafe workdir {workdir}: {workdir} is a symbolic link owned by nobody"
    check = inv("check", "--hosts", str(inventory))
    assert check.returncode == 1 and named in " ".join(text(check).split()), text(check)
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(SCRIPT)
    (payload / "requirements.txt").write_text("numpy\n")
    runs = tmp_path / "runs"
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--no-check")
    assert done.returncode == 1 and named in " ".join(text(done).split()), text(done)
    setup = inv("setup", "--hosts", str(inventory), "--payload", str(payload))
    assert setup.returncode == 1 and named in " ".join(text(setup).split()), text(setup)
    assert os.listdir(target) == [] and sorted(os.listdir(workdir.parent)) == ["work"]


def test_a_local_task_sees_no_variable_of_the_controllers_shell_the_inventory_does_not_name(
        tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text("import json, os\nprint(json.dumps(dict(os.environ)))\n")
    inventory = tmp_path / "local.yaml"
    inventory.write_text(f"hosts:\n  - name: here\n    transport: local\n"
                         f"    workdir: {tmp_path / 'work'}\n"
                         "    env: {NAMED: '${TFDEPLOY_TEST_NAMED}'}\n")
    runs = tmp_path / "runs"
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(runs), "--payload", str(payload), "--no-check"], cwd=REPO, capture_output=True,
        text=True, timeout=120,
        env={**os.environ, "TFDEPLOY_TEST_SHELL_SECRET": "s3cr3t", "TFDEPLOY_TEST_NAMED": "ok"})
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads((only_run(runs) / "worker-0.log").read_text().splitlines()[0])
    assert "TFDEPLOY_TEST_SHELL_SECRET" not in seen and "s3cr3t" not in json.dumps(seen)
    assert seen["NAMED"] == "ok" and seen["PATH"] == os.environ["PATH"]
    assert seen["HOME"] == os.environ["HOME"] and "TFDEPLOY_RUN_ID" in seen
