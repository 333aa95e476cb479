"""How fast a run is gone everywhere: after one worker's death, after Ctrl-C and after SIGTERM.

Three real sshd hosts on loopback (the test lab, on its own addresses) train the default
payload; task 2 sets SIGTERM to SIG_IGN once training runs, like a payload that ignores TERM.
Each scenario measures from the event to the moment no process carrying the run's
TFDEPLOY_RUN_ID is left on the machine (a /proc scan every 10 ms, as tests/procs.py does):

    worker death   SIGKILL to task 1's process group (as an OOM kill or a crash would)
    ctrl-c         SIGINT to the `inv train` controller
    sigterm        SIGTERM to the `inv train` controller (handled as Ctrl-C: run/signals.py)

    python benchmarks/bench_teardown.py [--repeats 3] [--grace 3]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from procs import processes_of_run  # noqa: E402
from sshlab import SshLab  # noqa: E402

LAB_OCTET = 60          # 127.0.0.60..62: apart from the test lab's addresses
DEAF_ENTRY = """\
import os, signal, sys
import tf_keras as keras
import train

class IgnoreTerm(keras.callbacks.Callback):
    # After the payload restored SIG_DFL on joining the cluster: task 2 ignores TERM.
    def on_train_begin(self, logs=None):
        if os.environ["TFDEPLOY_TASK_INDEX"] == "2":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

sys.exit(train.main(callbacks=[IgnoreTerm()]))
"""


def payload(tmp: Path) -> Path:
    target = tmp / "payload"
    subprocess.run(["cp", "-r", str(REPO / "payload"), str(target)], check=True)
    (target / "bench_deaf.py").write_text(DEAF_ENTRY)
    return target


def start_run(inventory: Path, runs: Path, pay: Path, hosts, grace: float):
    controller = subprocess.Popen(
        [sys.executable, "-m", "invoke", "train", "--hosts", str(inventory), "--runs-dir",
         str(runs), "--payload", str(pay), "--entry", "bench_deaf.py", "--grace", str(grace),
         "--args", "--epochs 1000 --steps-per-epoch 5"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if controller.poll() is not None:
            raise SystemExit(f"inv train ended early: {controller.returncode}")
        found = list(runs.glob("*/record.json")) if runs.exists() else []
        if not found:
            continue
        run_id = found[0].parent.name
        logs = [Path(h.workdir) / "runs" / run_id / f"worker-{i}.log" for i, h in enumerate(hosts)]
        # Every task has finished an epoch: training runs, task 2 ignores TERM by now.
        if all(p.exists() and '"event": "epoch"' in p.read_text(errors="replace") for p in logs):
            return controller, run_id
    raise SystemExit("training never reached an epoch on every host")


def gone_after(run_id: str, since: float, timeout: float = 60) -> float:
    while processes_of_run(run_id):
        if time.monotonic() - since > timeout:
            raise SystemExit(f"run {run_id}: processes left after {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - since


def one(scenario: str, inventory: Path, tmp: Path, pay: Path, hosts, grace: float) -> float:
    runs = tmp / f"runs-{scenario}-{time.time_ns()}"
    controller, run_id = start_run(inventory, runs, pay, hosts, grace)
    try:
        if scenario == "worker death":
            pid_file = Path(hosts[1].workdir) / "runs" / run_id / "worker-1.pid"
            pgid = json.loads(pid_file.read_text())["pgid"]
            since = time.monotonic()
            os.killpg(pgid, signal.SIGKILL)
        else:
            since = time.monotonic()
            controller.send_signal(signal.SIGINT if scenario == "ctrl-c" else signal.SIGTERM)
        took = gone_after(run_id, since)
        controller.wait(timeout=60)
        return took
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
        for pid in processes_of_run(run_id):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grace", type=float, default=3.0,
                        help="inv train --grace (default 3, the tool's default)")
    opts = parser.parse_args()
    results: dict[str, list[float]] = {"worker death": [], "ctrl-c": [], "sigterm": []}
    with tempfile.TemporaryDirectory() as tmp, SshLab(Path(tmp) / "lab",
                                                       first_octet=LAB_OCTET) as lab:
        hosts = lab.start(3)
        inventory = lab.write_inventory(Path(tmp) / "lab.yaml", hosts)
        pay = payload(Path(tmp))
        for _ in range(opts.repeats):
            for scenario in results:
                results[scenario].append(one(scenario, inventory, Path(tmp), pay, hosts,
                                             opts.grace))
    print(f"3 SSH hosts on loopback, task 2 ignores SIGTERM, --grace {opts.grace:g}; "
          f"{opts.repeats} repeats")
    for scenario, times in results.items():
        print(f"{scenario:>13} -> every task gone: " + " ".join(f"{t:.2f}" for t in times)
              + f" s; median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    ratio = statistics.median(results["sigterm"]) / statistics.median(results["ctrl-c"])
    print(f"sigterm / ctrl-c (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
