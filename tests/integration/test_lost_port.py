"""A port lost between check and launch (run/lostport.py), on two SSH lab hosts: another
process binds task 0's port just before the task does. The payload is a small server that
binds its TF_CONFIG port on every interface, as TensorFlow's gRPC server does, and says so in
Python's words (`[Errno 98] Address already in use`); TensorFlow's own message is the unit
tests' (tests/unit/test_lostport.py). Seconds per test."""
from __future__ import annotations

import json
import subprocess

import pytest
from test_runs import inv, lab_with_payload
from test_train import assert_nothing_left, only_run


# SO_REUSEADDR as servers set it (a port's TIME_WAIT connections do not stop them); not
# SO_REUSEPORT, which would let a second server bind beside it.
HOLD = ("import socket, sys, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('', int(sys.argv[1]))); s.listen(); print('held', flush=True); time.sleep(600)")

SERVER = f"""\
import json, os, socket, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]["index"]
port = int(config["cluster"]["worker"][me].rsplit(":", 1)[1])
attempt = os.environ["TFDEPLOY_ATTEMPT"]
if me == 0 and (attempt == "1" or "--always" in sys.argv):
    # Another process takes the port first (it ends with the task's process group).
    holder = subprocess.Popen([sys.executable, "-c", {HOLD!r}, str(port)],
                              stdout=subprocess.PIPE)
    holder.stdout.readline()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("", port))
server.listen()
print(f"attempt {{attempt}}: serving on port {{port}}", flush=True)
for epoch in range(1, 4):
    time.sleep(0.2)
    print(json.dumps({{"event": "epoch", "task": me, "epoch": epoch, "loss": 1 / epoch}}),
          flush=True)
"""


@pytest.fixture
def lab(ssh_lab, tmp_path):
    return lab_with_payload(ssh_lab, tmp_path, SERVER)


def train(lab, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict, dict]:
    inventory, hosts, payload = lab
    runs = tmp_path / "runs"
    # --no-check: the payload is not TensorFlow; ports then come from the port probe.
    done = inv("train", "--hosts", str(inventory), "--runs-dir", str(runs), "--payload",
               str(payload), "--no-check", "--start-timeout", "0", "--grace", "1", *args)
    run_dir = only_run(runs)
    summary = json.loads((run_dir / "summary.json").read_text())
    # The record holds the ports of the last attempt (plan.json those of the first).
    record = json.loads((run_dir / "record.json").read_text())
    assert_nothing_left(run_dir, hosts)
    return done, summary, record


def test_a_lost_port_relaunches_the_run_on_new_ports_once(lab, tmp_path):
    done, summary, record = train(lab, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lost = summary["failed_attempts"][0]
    assert summary["attempts"] == 2 and lost["failed_task"] == "worker-0"
    port = int(lost["reason"].split()[1])
    assert lost["reason"] == (f"port {port} on h1 was taken by another process before "
                              "worker-0 could bind it")
    assert f"{lost['reason']}: relaunching every task on new ports" in done.stdout
    assert "attempt 2 started" in done.stdout and "Traceback" not in done.stderr
    ports = [t["port"] for t in record["tasks"]]
    assert len(ports) == 2 and port not in ports
    for i in range(2):
        assert f"attempt 2: serving on port {ports[i]}" in done.stdout
    assert [t["exit_code"] for t in summary["tasks"]] == [0, 0]


def test_a_port_lost_twice_fails_naming_the_host_and_the_port(lab, tmp_path):
    done, summary, _ = train(lab, tmp_path, "--args", "--always")
    assert done.returncode == 1, done.stdout + done.stderr
    reason = summary["failure"]["reason"]
    assert reason.startswith("port ") and reason.endswith(
        " on h1 was taken by another process before worker-0 could bind it, again on new ports")
    assert reason in done.stdout and summary["attempts"] == 2
    assert int(reason.split()[1]) != int(summary["failed_attempts"][0]["reason"].split()[1])
