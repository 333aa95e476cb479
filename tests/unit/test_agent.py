"""The host-side agent, run locally as it runs on a host: launch, follow, stop, cleanup."""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from deploy.bundle import BundleError, build_bundle

AGENT = Path(__file__).resolve().parents[2] / "deploy" / "agent.py"
RUN_ID = "20260101-000000-feed01"


def agent(*args: str, stdin: str = "") -> dict:
    done = subprocess.run([sys.executable, str(AGENT), *args], input=stdin, text=True,
                          capture_output=True, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.fixture
def rundir(tmp_path):
    path = tmp_path / "work" / "runs" / RUN_ID
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    yield path
    # Whatever a failing test left running: end it by the group the agent recorded.
    for pid_file in path.glob("worker-*.pid") if path.exists() else []:
        try:
            os.killpg(json.loads(pid_file.read_text())["pgid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def launch(rundir: Path, task: int, *argv: str) -> dict:
    env = json.dumps({"env": {"TFDEPLOY_RUN_ID": RUN_ID, "GREETING": "hi there"}})
    return agent("launch", str(rundir), str(task), str(rundir), "--", *argv, stdin=env)


def poll_until_ended(rundir: Path, task: int, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = agent("poll", str(rundir), f"{task}:0")["tasks"][str(task)]
        if status["state"] in ("exited", "lost"):
            return status
        time.sleep(0.1)
    raise AssertionError("task did not end")


def test_ports_are_distinct():
    ports = agent("ports", "/nonexistent", "5")["ports"]
    assert len(set(ports)) == 5 and all(0 < p < 65536 for p in ports)


def test_launch_records_exit_code_and_log_with_the_given_environment(rundir):
    info = launch(rundir, 0, "/bin/sh", "-c", 'echo "$GREETING"; exit 4')
    assert info["pid"] == info["pgid"]
    status = poll_until_ended(rundir, 0)
    assert (status["state"], status["code"]) == ("exited", 4)
    assert base64.b64decode(status["data"]) == b"hi there\n"


def test_follow_streams_until_every_task_has_ended(rundir):
    launch(rundir, 0, "/bin/sh", "-c", "echo one; sleep 0.3; echo two")
    launch(rundir, 1, "/bin/sh", "-c", "exit 0")
    done = subprocess.run([sys.executable, str(AGENT), "follow", str(rundir), "0:0", "1:0"],
                          capture_output=True, text=True, timeout=30, check=True)
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    logged = b"".join(base64.b64decode(d["tasks"]["0"]["data"]) for d in docs if "0" in d["tasks"])
    assert logged == b"one\ntwo\n"
    finals = {}
    for doc in docs:
        for task, status in doc["tasks"].items():
            finals[task] = status
    assert {t: (s["state"], s["code"]) for t, s in finals.items()} == {
        "0": ("exited", 0), "1": ("exited", 0)}


def test_stop_escalates_to_kill_for_a_task_that_ignores_term(rundir):
    launch(rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)")
    time.sleep(0.5)
    result = agent("stop", str(rundir), "0.5")
    assert result["survivors"] == []
    assert result["signalled"]["0"] == ["SIGTERM", "SIGKILL"]
    status = poll_until_ended(rundir, 0)
    assert status["state"] in ("exited", "lost")


def test_cleanup_deletes_only_its_own_run_directory(rundir, tmp_path):
    impostor = tmp_path / "work" / "runs" / "other-name"
    impostor.mkdir()
    (impostor / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    refused = subprocess.run([sys.executable, str(AGENT), "cleanup", str(impostor), "1"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "refusing to delete" in refused.stderr
    assert impostor.exists()
    launch(rundir, 0, "sleep", "60")
    result = agent("cleanup", str(rundir), "1")
    assert result["survivors"] == [] and not rundir.exists()
    assert (tmp_path / "work" / "runs").exists()


def test_bundle_holds_payload_agent_and_identity(tmp_path):
    payload = tmp_path / "payload"
    (payload / "pkg" / "__pycache__").mkdir(parents=True)
    (payload / "train.py").write_text("print('hi')\n")
    (payload / "pkg" / "util.py").write_text("X = 1\n")
    (payload / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    with tarfile.open(fileobj=io.BytesIO(build_bundle(payload, "train.py", RUN_ID))) as tar:
        names = sorted(tar.getnames())
        assert json.load(tar.extractfile("run.json")) == {"run_id": RUN_ID}
    assert names == ["payload/pkg/util.py", "payload/train.py", "run.json", "tfdeploy_agent.py"]


def test_bundle_refuses_bad_payloads(tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    with pytest.raises(BundleError, match="entry script 'train.py' not found"):
        build_bundle(payload, "train.py", RUN_ID)
    (payload / "train.py").write_text("")
    (payload / "secrets").symlink_to("/etc")
    with pytest.raises(BundleError, match="symlink points outside the payload"):
        build_bundle(payload, "train.py", RUN_ID)
    with pytest.raises(BundleError, match="does not exist"):
        build_bundle(tmp_path / "missing", "train.py", RUN_ID)
