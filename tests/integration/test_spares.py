"""Runs that survive losing a host, over four real sshd servers on loopback with real
TensorFlow: a host frozen at epoch 6 of 24 (SIGSTOP of its sshd and of every process of the
run there, as a VM that vanishes), named after 5 s without heartbeats. With --restarts its
tasks go to a `role: spare` host, or away (--shrink), and training resumes from the
controller's copy of the chief's backup, the chief's own host lost or not, and also where all
four hosts share one workdir; and a host cut off rather than frozen: in a network namespace
whose links go down. Once the lost host answers again, `inv down` leaves nothing of the run
anywhere, and keeps how the run ended.

How long from the loss to the new attempt's first epoch is printed, not asserted.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from test_lost_host import Controller, children, down, freezer, signal_all
from test_train import REPO

from netns import NetnsHost, NetnsUnavailable
from procs import wait_until_gone
from sshlab import SshLab

EPOCHS, LOST_AT = 24, 6
TRAIN = ("--args", f"--epochs {EPOCHS} --steps-per-epoch 40", "--grace", "1",
         "--lost-after", "5")


@pytest.fixture
def four_hosts(tmp_path):
    with SshLab(tmp_path / "lab", first_octet=90) as lab:
        hosts = lab.start(4)
        try:
            yield lab, hosts
        finally:
            for pid in lab.pids:       # never leave a stopped server behind
                signal_all(children({pid}), signal.SIGCONT)


@pytest.fixture
def four_sharing_a_workdir(tmp_path):
    """Four hosts with one workdir between them, as an NFS home gives lab servers."""
    with SshLab(tmp_path / "lab", first_octet=91) as lab:
        hosts = lab.sharing_workdir(lab.start(4))
        try:
            yield lab, hosts
        finally:
            for pid in lab.pids:
                signal_all(children({pid}), signal.SIGCONT)


def events(log: Path, kind: str) -> list[dict]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"event": "%s"' % kind):
            found.append(json.loads(line))
    return found


def wait_for_epoch(runs: Path, controller: Controller, log: str, epoch: int) -> str:
    """The run's id once the local copy of `log` shows the end of epoch `epoch`."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        found = list(runs.glob("*/record.json")) if runs.exists() else []
        if found and (found[0].parent / log).exists() and any(
                e["epoch"] >= epoch for e in events(found[0].parent / log, "epoch")):
            return found[0].parent.name
        assert controller.proc.poll() is None, controller.output
        time.sleep(0.1)
    raise AssertionError(f"{log} never reached epoch {epoch}:\n{controller.output}")


def lose_and_recover(tmp_path: Path, lab: SshLab, hosts, roles: dict[int, str], lost: int,
                     *flags: str, per_host: dict[str, dict] | None = None,
                     losing: tuple[Callable[[str], None], Callable[[], None]] | None = None
                     ) -> tuple[Controller, str, Path]:
    """Train on `hosts` (`roles`: index -> role; `per_host`: more fields by host name), lose
    host `lost` once worker 0 has ended epoch LOST_AT, and return the controller once it
    exited, the run's id and runs dir. The host is frozen and thawed afterwards, or lost by
    `losing`'s first function (given the run's id) and given back by its second."""
    fields = {name: dict(more) for name, more in (per_host or {}).items()}
    for index, role in roles.items():
        fields.setdefault(hosts[index].name, {})["role"] = role
    inventory = lab.write_inventory(tmp_path / "hosts.yaml", hosts, per_host=fields)
    runs = tmp_path / "runs"
    controller = Controller("--hosts", str(inventory), "--runs-dir", str(runs), *TRAIN,
                            *flags)
    freeze, thaw = losing or freezer(lab, lost, hosts[lost].workdir)
    run_id = None
    try:
        run_id = wait_for_epoch(runs, controller, "worker-0.log", LOST_AT)
        lost_at = time.monotonic()
        freeze(run_id)
        controller.finish(timeout=420)
        named = controller.first("no heartbeat for")
        begun = controller.first("attempt 2 started")
        first = begun and next((at for at, line in controller.lines
                                if at > begun and line.startswith("[worker-0 ")
                                and " epoch " in line), None)
        print(f"lost at epoch {LOST_AT}: named after {seconds(named, lost_at)} s, attempt 2 "
              f"started after {seconds(begun, lost_at)} s, its first epoch after "
              f"{seconds(first, lost_at)} s")
    finally:
        thaw()
        controller.finish(timeout=60)
    return controller, run_id, runs


def seconds(at: float | None, since: float) -> str:
    return "-" if at is None else f"{at - since:.1f}"


def assert_resumed(runs: Path, run_id: str, workers: int) -> None:
    """The new attempt resumed from epoch LOST_AT - 1 or later and finished every epoch."""
    run_dir = runs / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["attempts"] == 2, summary
    assert len(summary["tasks"]) == workers, summary["tasks"]
    assert all(t["epochs"] == EPOCHS for t in summary["tasks"]), summary["tasks"]
    resumed = [e["epoch"] for e in events(run_dir / "worker-0.log", "resumed")]
    assert resumed and resumed[-1] >= LOST_AT - 1, resumed
    # Finished with exit 0: nothing will resume it, so the copy of the backup is gone.
    assert not (run_dir / "backup").exists()


def assert_down_leaves_nothing(runs: Path, run_id: str, hosts) -> None:
    """`inv down` ends and removes what the lost host kept of the ended run, and keeps how the
    run ended: its summary (but what its end could not reach) and its record's state."""
    summary, record = runs / run_id / "summary.json", runs / run_id / "record.json"
    ended, state = json.loads(summary.read_text()), json.loads(record.read_text())["state"]
    done = down(runs, run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_until_gone(run_id, 10) == [], done.stdout
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / run_id).exists(), (host, done.stdout)
    after = json.loads(summary.read_text())
    assert after == dict(ended, teardown_problems=[], lost_hosts=[]), (ended, after)
    assert json.loads(record.read_text())["state"] == state, done.stdout


@pytest.mark.parametrize("lost", [2, 0], ids=["a-worker-host", "the-chief-host"])
def test_a_spare_takes_the_lost_hosts_tasks(four_hosts, tmp_path, lost):
    lab, hosts = four_hosts
    controller, run_id, runs = lose_and_recover(tmp_path, lab, hosts, {3: "spare"}, lost,
                                                "--restarts", "2")
    out = controller.output
    assert controller.proc.returncode == 0, out
    assert f"{hosts[3].name} takes the tasks of {hosts[lost].name}" in out, out
    assert_resumed(runs, run_id, workers=3)
    record = json.loads((runs / run_id / "record.json").read_text())
    on = {t["endpoint"].rsplit(":", 1)[0] for t in record["tasks"]}
    assert hosts[3].address in on and hosts[lost].address not in on, record["tasks"]
    assert f"not reached: {hosts[lost].name}" in out, out
    assert_down_leaves_nothing(runs, run_id, hosts)


def test_a_spare_on_a_workdir_the_lost_host_shares(four_sharing_a_workdir, tmp_path):
    """The lost host's run directory is the spare's too: its frozen tasks' files are there
    when the spare's start."""
    lab, hosts = four_sharing_a_workdir
    controller, run_id, runs = lose_and_recover(tmp_path, lab, hosts, {3: "spare"}, 2,
                                                "--restarts", "2")
    assert controller.proc.returncode == 0, controller.output
    assert_resumed(runs, run_id, workers=3)
    assert_down_leaves_nothing(runs, run_id, hosts)


def test_a_spare_takes_the_tasks_of_a_host_whose_link_went_down(tmp_path):
    """The lost host is in a network namespace whose links (SSH and cluster) go down: nothing
    of it is frozen, it is only cut off. Its run directory stays there until `inv down`, once
    the links are up again. (Its task ends sooner here: every lab host is this machine, and
    the other hosts' stop ends the run's processes by the run id in their environment.)"""
    try:
        namespace = NetnsHost()
        namespace.__enter__()
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with SshLab(tmp_path / "lab", first_octet=96) as lab:
            near = lab.start(1)[0]
            namespace.check_exists()
            cut = lab.start_in_netns(namespace.name, namespace.ctl_ns)
            far, spare = lab.start(2)
            spare_address = namespace.add_root_address()
            hosts = [near, cut, far, spare]
            # The namespace reaches this machine by its links' addresses, not at 127.0.0.x;
            # the spare, which only the hosts here dial, has one more address here.
            addresses = {near.name: namespace.ctl_root, cut.name: namespace.mesh_ns,
                         far.name: namespace.mesh_root, spare.name: spare_address}

            def cut_links(run_id: str) -> None:
                namespace.set_links("down")

            def restore() -> None:
                namespace.set_links("up")
            controller, run_id, runs = lose_and_recover(
                tmp_path, lab, hosts, {3: "spare"}, 1, "--restarts", "2",
                per_host={name: {"cluster_address": address}
                          for name, address in addresses.items()},
                losing=(cut_links, restore))
            out = controller.output
            assert controller.proc.returncode == 0, out
            assert f"{spare.name} takes the tasks of {cut.name}" in out, out
            assert_resumed(runs, run_id, workers=3)
            record = json.loads((runs / run_id / "record.json").read_text())
            on = {t["endpoint"].rsplit(":", 1)[0] for t in record["tasks"]}
            assert spare_address in on and namespace.mesh_ns not in on, record["tasks"]
            assert f"not reached: {cut.name}" in out, out
            assert (Path(cut.workdir) / "runs" / run_id).is_dir()
            # `inv down` once the host answers again (it fails naming a host out of reach): on
            # a loaded machine the first connection over the links just set up can fail.
            lab.wait_reachable(cut)
            assert_down_leaves_nothing(runs, run_id, hosts)
            # Cleaning up after the lost host leaves the run finished: nothing to resume.
            again = subprocess.run(
                [sys.executable, "-m", "invoke", "resume", "--run", run_id, "--runs-dir",
                 str(runs)], cwd=REPO, capture_output=True, text=True, timeout=60)
            said = again.stdout + again.stderr
            assert again.returncode == 2 and "nothing to resume" in said, said
    finally:
        namespace.close()


def test_shrink_goes_on_with_the_hosts_that_remain(four_hosts, tmp_path):
    lab, hosts = four_hosts
    controller, run_id, runs = lose_and_recover(tmp_path, lab, hosts[:3], {}, 2,
                                                "--restarts", "1", "--shrink")
    out = controller.output
    assert controller.proc.returncode == 0, out
    assert f"going on without {hosts[2].name}: 2 worker(s)" in out, out
    assert_resumed(runs, run_id, workers=2)
    assert_down_leaves_nothing(runs, run_id, hosts[:3])


def test_without_restarts_the_run_fails_and_resume_goes_on(four_hosts, tmp_path):
    """Every run keeps a copy of the chief's backup, --restarts or not: any run can be
    resumed."""
    lab, hosts = four_hosts
    controller, run_id, runs = lose_and_recover(tmp_path, lab, hosts[:3], {}, 2)
    out = controller.output
    assert controller.proc.returncode == 1, out
    assert f"{hosts[2].name}" in out and "the host is lost — stopping the other tasks" in out, out
    # The lost host answers again: what the failed run left there goes.
    assert_down_leaves_nothing(runs, run_id, hosts[:3])
    # A new VM in place of the lost one.
    elsewhere = lab.write_inventory(tmp_path / "resume.yaml", [hosts[0], hosts[1], hosts[3]])
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "resume", "--run", run_id, "--runs-dir", str(runs),
         "--hosts", str(elsewhere), "--lost-after", "5"], cwd=REPO, capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_resumed(runs, run_id, workers=3)
    log = (runs / run_id / "worker-2.log").read_text()
    assert "==== tfdeploy: attempt 2 of task 2 starts at" in log
    assert_down_leaves_nothing(runs, run_id, hosts)
    again = subprocess.run([sys.executable, "-m", "invoke", "resume", "--run", run_id,
                            "--runs-dir", str(runs)], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert again.returncode == 2 and "nothing to resume" in again.stderr + again.stdout, again
