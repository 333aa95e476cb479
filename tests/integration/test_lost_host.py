"""A host that stops answering mid-run: frozen (SIGSTOP of its sshd and of every process of the
run there, as when a VM is paused) or cut off (its link set down in a network namespace).
The controller names it from the missing heartbeats, stops every other host's tasks and exits
non-zero; once the host is back, `inv down --run ID` leaves nothing of the run anywhere.

Times are printed, not asserted: how long the controller took to name the host, and how long
until the other hosts' tasks were gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_train import REPO

from netns import NetnsHost, NetnsUnavailable
from procs import end, processes_of_run, wait_until_gone
from sshlab import SshLab


# Prints a line five times a second for five minutes: a payload without TensorFlow, which
# nothing but the controller would notice stopping.
TICKER = ("import sys, time\n"
          "for i in range(1500):\n"
          "    print('tick', i, flush=True)\n"
          "    time.sleep(0.2)\n")


class Controller:
    """`inv train` in the background, its output lines kept with the time each arrived."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "invoke", "train", *args], cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "COLUMNS": "200"})
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, text: str) -> float | None:
        return next((at for at, line in self.lines if text in line), None)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            end(self.proc)
            self.reader.join(5)


def run_id_once_started(runs: Path, controller: Controller, logs: list[str], text: str,
                        timeout: float = 180) -> str:
    """The run id, once every log in `logs` (local copies) shows `text`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(runs.glob("*/record.json")) if runs.exists() else []
        if found:
            run_dir = found[0].parent
            if all((run_dir / log).exists() and text in (run_dir / log).read_text()
                   for log in logs):
                return run_dir.name
        assert controller.proc.poll() is None, controller.output
        time.sleep(0.2)
    raise AssertionError(f"the tasks never printed {text!r}:\n{controller.output}")


def children(pids: set[int]) -> set[int]:
    """`pids` and all their descendants."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, grew = set(pids), True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


def works_in(pid: int, workdir: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(str(workdir))
    except OSError:
        return False


def processes_of_host(run_id: str, sshd: int, workdir: Path) -> set[int]:
    """Everything of the run on one lab host: its sshd and what runs under it (the sessions,
    the agent), and the run's processes working in its workdir (tasks run in sessions of their
    own, outside sshd's tree)."""
    return children({sshd} | {pid for pid in processes_of_run(run_id) if works_in(pid, workdir)})


def signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def down(runs: Path, run_id: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "down", "--runs-dir", str(runs),
                           "--run", run_id],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def lose_a_host(tmp_path: Path, lab: SshLab, hosts, inventory: Path, args: tuple[str, ...],
                started: str, lose, restore) -> None:
    """Start a run on `hosts`, lose the second host with `lose()` once every task printed
    `started`, and check what the controller does; then `restore()` it and check `inv down`."""
    runs = tmp_path / "runs"
    controller = Controller("--hosts", str(inventory), "--runs-dir", str(runs), "--grace", "1",
                            "--lost-after", "10", *args)
    run_id = None
    try:
        run_id = run_id_once_started(runs, controller, [f"worker-{i}.log" for i in range(3)],
                                     started)
        lost_at = time.monotonic()
        lose(run_id)
        code = controller.finish(timeout=240)
        out = controller.output
        named = controller.first(f"{hosts[1].name} ({hosts[1].address}): no heartbeat for")
        assert code != 0, out
        assert named is not None, out
        # The tasks' own tracebacks (TensorFlow's workers fail by themselves) are shown as
        # their lines; the controller prints none of its own.
        assert not any(line.startswith("Traceback") for _, line in controller.lines), out
        others = [pid for pid in processes_of_run(run_id)
                  if not works_in(pid, hosts[1].workdir)]
        print(f"host named {named - lost_at:.1f} s after it was lost; controller exited "
              f"{controller.proc.returncode} {time.monotonic() - lost_at:.1f} s after; "
              f"other hosts' processes left: {others}")
        assert not others, out
        assert f"inv down --run {run_id}" in out, out
    finally:
        restore()
        controller.finish(timeout=60)
    lab.wait_reachable(hosts[1])        # `inv down` once the host answers again
    done = down(runs, run_id)
    assert done.returncode == 0, done.stdout + done.stderr
    assert wait_until_gone(run_id, 10) == [], done.stdout
    for host in hosts:
        assert not (Path(host.workdir) / "runs" / run_id).exists(), host


@pytest.fixture
def three_hosts(tmp_path):
    with SshLab(tmp_path / "lab", first_octet=60) as lab:
        hosts = lab.start(3)
        try:
            yield lab, hosts, lab.write_inventory(tmp_path / "hosts.yaml", hosts)
        finally:
            for pid in lab.pids:       # never leave a stopped server behind
                signal_all(children({pid}), signal.SIGCONT)


@pytest.fixture
def ticker(tmp_path) -> Path:
    folder = tmp_path / "ticker"
    folder.mkdir()
    (folder / "tick.py").write_text(TICKER)
    return folder


def freezer(lab: SshLab, host_index: int, workdir: Path):
    frozen: set[int] = set()

    def freeze(run_id: str) -> None:
        frozen.update(processes_of_host(run_id, lab.pids[host_index], workdir))
        signal_all(frozen, signal.SIGSTOP)

    def thaw() -> None:
        signal_all(frozen, signal.SIGCONT)
    return freeze, thaw


def test_a_frozen_host_without_tensorflow_is_named_and_the_rest_stopped(three_hosts, tmp_path,
                                                                        ticker):
    lab, hosts, inventory = three_hosts
    freeze, thaw = freezer(lab, 1, hosts[1].workdir)
    lose_a_host(tmp_path, lab, hosts, inventory,
                ("--payload", str(ticker), "--entry", "tick.py", "--no-check"), "tick 3",
                freeze, thaw)


def test_a_frozen_host_while_training_with_tensorflow(three_hosts, tmp_path):
    lab, hosts, inventory = three_hosts
    freeze, thaw = freezer(lab, 1, hosts[1].workdir)
    lose_a_host(tmp_path, lab, hosts, inventory,
                ("--args", "--epochs 500 --steps-per-epoch 5", "--no-check"),
                '"event": "epoch"', freeze, thaw)


def test_a_cut_link_is_a_lost_host(tmp_path, ticker):
    try:
        namespace = NetnsHost()
        namespace.__enter__()
    except NetnsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with SshLab(tmp_path / "lab", first_octet=64) as lab:
            near = lab.start(1)[0]
            namespace.check_exists()
            cut = lab.start_in_netns(namespace.name, namespace.ctl_ns)
            far = lab.start(1)[0]
            hosts = [near, cut, far]
            # The namespace reaches this machine by its links' addresses, not at 127.0.0.x.
            inventory = lab.write_inventory(tmp_path / "hosts.yaml", hosts, per_host={
                near.name: {"cluster_address": namespace.ctl_root},
                far.name: {"cluster_address": namespace.mesh_root},
                cut.name: {"cluster_address": namespace.mesh_ns}})
            link = namespace.ctl[1]

            def cut_link(run_id: str) -> None:
                subprocess.run(["ip", "netns", "exec", namespace.name, "ip", "link", "set",
                                link, "down"], check=True, timeout=20)

            def restore() -> None:
                subprocess.run(["ip", "netns", "exec", namespace.name, "ip", "link", "set",
                                link, "up"], check=True, timeout=20)
                namespace.check_routes()
            lose_a_host(tmp_path, lab, hosts, inventory,
                        ("--payload", str(ticker), "--entry", "tick.py", "--no-check"),
                        "tick 3", cut_link, restore)
    finally:
        namespace.close()
