"""The host-side agent, run locally as it runs on a host: ports, launch, poll, follow, stop,
cleanup; and one planned launch end to end through the local transport (no SSH, no network).

Every test uses its own run id, and whatever a test started is ended afterwards by pid: the
processes whose environment holds that run's TFDEPLOY_RUN_ID (tests/procs.py).
"""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest

import hostpkg
from deploy.host import env as hostenv
from deploy.host import envkey
from deploy.host.frames import read_frame
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.planner import (
    Options, cleanup_command, fetch_output_command, framed, plan_run, poll_command, stop_command
)
from deploy.push.payload import PayloadPush
from deploy.ssh.transport import LocalTransport
from procs import processes_of_run, wait_until_gone


def kill_run(run_id: str) -> None:
    for pid in processes_of_run(run_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until_gone(run_id, 5)


@pytest.fixture
def run_id():
    rid = f"20260101-000000-{uuid.uuid4().hex[:6]}"
    try:
        yield rid
    finally:
        kill_run(rid)


@pytest.fixture
def rundir(tmp_path, run_id):
    path = tmp_path / "work" / "runs" / run_id
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"run_id": run_id}))
    return path


def run_agent(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*hostpkg.command(Path(args[1])), *args], input=stdin, text=True,
                          capture_output=True, timeout=30, env=env)


def agent(*args: str, stdin: str = "", env: dict | None = None) -> dict:
    done = run_agent(*args, stdin=stdin, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def launch(rundir: Path, task: int, *argv: str, env: dict | None = None, **kw) -> dict:
    doc = {"env": {"TFDEPLOY_RUN_ID": rundir.name, **(env or {})}}
    return agent("launch", str(rundir), str(task), str(rundir), "--", *argv,
                 stdin=json.dumps(doc), **kw)


def poll(rundir: Path, task: int, offset: int = 0) -> dict:
    return agent("poll", str(rundir), f"{task}:{offset}")["tasks"][str(task)]


def poll_until_ended(rundir: Path, task: int, timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = poll(rundir, task)
        if status["state"] in ("exited", "lost"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"task {task} did not end within {timeout} s")


def wait_for_log(rundir: Path, task: int, text: bytes, timeout: float = 10) -> None:
    log = rundir / f"worker-{task}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_bytes():
            return
        time.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {log}")


def test_launch_records_exit_code_and_log(rundir, run_id):
    info = launch(rundir, 0, "/bin/sh", "-c", "echo hi; exit 4")
    assert info["pid"] == info["pgid"] and info["started"] > 0
    assert json.loads((rundir / "worker-0.pid").read_text()) == info
    status = poll_until_ended(rundir, 0)
    assert (status["state"], status["code"], status["pid"]) == ("exited", 4, info["pid"])
    assert base64.b64decode(status["data"]) == b"hi\n"
    assert (status["offset"], status["size"]) == (3, 3)
    assert status["ended"] >= status["started"]
    assert (rundir / "worker-0.log").read_bytes() == b"hi\n"
    assert json.loads((rundir / "worker-0.exit").read_text())["code"] == 4
    # Reading on from an offset gives only the rest.
    rest = poll(rundir, 0, offset=1)
    assert base64.b64decode(rest["data"]) == b"i\n" and rest["offset"] == 3
    assert wait_until_gone(run_id, 5) == []       # the supervisor exits right after the task


@pytest.mark.parametrize("exists", [True, False])
def test_launch_prefers_the_setup_env_python_when_it_exists(rundir, tmp_path, exists):
    """`inv setup`'s interpreter for these requirements on this host (envkey.py) replaces
    ARGV[0] when present; else the host's python runs. Another host's environment of the same
    requirements, in the same workdir, is not used."""
    requirements = "c" * 64
    other = Path(envkey.env_python(str(tmp_path / "work"), requirements, key="f" * 16))
    other.parent.mkdir(parents=True)
    other.symlink_to(sys.executable)
    envpy = Path(envkey.env_python(str(tmp_path / "work"), requirements))
    if exists:
        envpy.parent.mkdir(parents=True)
        envpy.symlink_to(sys.executable)
    doc = {"env": {"TFDEPLOY_RUN_ID": rundir.name}}
    agent("launch", str(rundir), "0", str(rundir), requirements, "--", sys.executable, "-c",
          "import sys; print(sys.executable)", stdin=json.dumps(doc))
    status = poll_until_ended(rundir, 0)
    assert status["code"] == 0
    ran = base64.b64decode(status["data"]).decode().strip()
    assert ran == (str(envpy) if exists else sys.executable)


def test_launch_passes_the_environment_from_stdin_and_runs_in_cwd(rundir):
    hostile = "a b 'c' \"d\" $(touch x) `id` ;\nnaïve"
    launch(rundir, 0, "/bin/sh", "-c", 'printf "%s|%s|%s" "$GREETING" "$TFDEPLOY_RUN_ID" "$PWD"',
           env={"GREETING": hostile})
    status = poll_until_ended(rundir, 0)
    assert status["code"] == 0
    assert base64.b64decode(status["data"]).decode() == f"{hostile}|{rundir.name}|{rundir}"
    assert not (rundir / "x").exists()


def test_path_variables_are_expanded_and_created_on_the_host(rundir, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    # The agent runs with a private HOME, so ~/ is that directory, not this user's home.
    doc = {"env": {"TFDEPLOY_RUN_ID": rundir.name, "TFDEPLOY_OUTPUT_DIR": "~/out/put"}}
    agent("launch", str(rundir), "0", str(rundir), "--", "/bin/sh", "-c",
          'printf %s "$TFDEPLOY_OUTPUT_DIR"', stdin=json.dumps(doc), env=env)
    status = poll_until_ended(rundir, 0)
    assert base64.b64decode(status["data"]).decode() == f"{home}/out/put"
    assert (home / "out" / "put").is_dir()


def test_a_program_that_cannot_start_exits_127(rundir):
    launch(rundir, 0, str(rundir / "no-such-program"))
    status = poll_until_ended(rundir, 0)
    assert (status["state"], status["code"]) == ("exited", 127)
    assert b"tfdeploy: cannot start" in base64.b64decode(status["data"])


def test_poll_of_a_task_never_launched_is_pending(rundir):
    status = poll(rundir, 7)
    assert status == {"state": "pending", "size": 0, "offset": 0, "data": ""}


def test_poll_refuses_a_directory_that_is_not_a_run(tmp_path):
    done = run_agent("poll", str(tmp_path), "0:0")
    assert done.returncode != 0 and "not a tfdeploy run directory" in done.stderr


def test_a_killed_supervisor_makes_the_task_lost(rundir):
    info = launch(rundir, 0, "sleep", "60")
    os.killpg(info["pgid"], signal.SIGKILL)      # the whole group, as a crash or OOM would
    status = poll_until_ended(rundir, 0)
    assert status["state"] == "lost" and "code" not in status


def wait_for_processes(run_id: str, count: int, timeout: float = 10) -> None:
    """Until the supervisor and its task (both carry the run's marker) are running."""
    deadline = time.monotonic() + timeout
    while len(processes_of_run(run_id)) < count:
        assert time.monotonic() < deadline, "task did not start"
        time.sleep(0.02)


def test_stop_ends_a_sleeping_task_with_sigterm(rundir, run_id):
    info = launch(rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)                 # the supervisor and sleep
    result = agent("stop", str(rundir), "1")
    assert result == {"signalled": {"0": ["SIGTERM"]}, "survivors": []}
    assert processes_of_run(run_id) == []
    status = poll_until_ended(rundir, 0)
    # The supervisor outlives the TERM and records how its child ended: 128 + SIGTERM.
    assert (status["state"], status["code"]) == ("exited", 128 + signal.SIGTERM)
    assert status["pid"] == info["pid"]
    # Stopping again finds nothing to signal.
    assert agent("stop", str(rundir), "1") == {"signalled": {}, "survivors": []}


def test_stop_escalates_to_kill_for_a_task_that_ignores_term(rundir, run_id):
    launch(rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('ready', flush=True); time.sleep(60)")
    wait_for_log(rundir, 0, b"ready\n")
    result = agent("stop", str(rundir), "0.3")
    assert result == {"signalled": {"0": ["SIGTERM", "SIGKILL"]}, "survivors": []}
    assert processes_of_run(run_id) == []
    assert poll_until_ended(rundir, 0)["state"] in ("exited", "lost")


def test_follow_streams_until_every_task_has_ended(rundir):
    launch(rundir, 0, "/bin/sh", "-c", "echo one; sleep 0.3; echo two")
    launch(rundir, 1, "/bin/sh", "-c", "exit 3")
    done = subprocess.run([*hostpkg.command(rundir), "follow", str(rundir), "0:0", "1:0"],
                          capture_output=True, timeout=30, check=True)
    stream = io.BytesIO(done.stdout)
    docs = list(iter(lambda: read_frame(stream), None))
    logged = b"".join(d["tasks"]["0"]["data"] for d in docs if "0" in d["tasks"])
    assert logged == b"one\ntwo\n"
    finals = {}
    for doc in docs:
        finals.update(doc["tasks"])
    assert {t: (s["state"], s["code"]) for t, s in finals.items()} == {
        "0": ("exited", 0), "1": ("exited", 3)}


def test_cleanup_refuses_a_directory_not_named_after_its_run(rundir, tmp_path, run_id):
    impostor = tmp_path / "work" / "runs" / "other-name"
    impostor.mkdir()
    (impostor / "run.json").write_text(json.dumps({"run_id": run_id}))
    refused = run_agent("cleanup", str(impostor), "1")
    assert refused.returncode != 0 and "refusing to delete" in refused.stderr
    assert (impostor / "run.json").exists()
    # Named after the run, but not below a runs/ directory.
    stray = tmp_path / "elsewhere" / run_id
    stray.mkdir(parents=True)
    (stray / "run.json").write_text(json.dumps({"run_id": run_id}))
    refused = run_agent("cleanup", str(stray), "1")
    assert refused.returncode != 0 and "refusing to delete" in refused.stderr
    assert stray.exists()
    # No run.json at all.
    bare = tmp_path / "work" / "runs" / "bare"
    bare.mkdir()
    refused = run_agent("cleanup", str(bare), "1")
    assert refused.returncode != 0 and "not a tfdeploy run directory" in refused.stderr
    assert bare.exists()


def test_cleanup_stops_the_run_and_removes_its_directory(rundir, tmp_path, run_id):
    launch(rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)
    (rundir / "output").mkdir()
    (rundir / "output" / "model.bin").write_bytes(b"\0" * 10)
    result = agent("cleanup", str(rundir), "1")
    assert result["survivors"] == [] and result["removed"] == os.path.realpath(rundir)
    assert result["signalled"] == {"0": ["SIGTERM"]}
    assert not rundir.exists()
    assert (tmp_path / "work" / "runs").is_dir()       # only the run's own directory goes
    assert processes_of_run(run_id) == []


def test_unknown_verb_fails(rundir):
    done = run_agent("explode", str(rundir))
    assert done.returncode != 0 and "unknown verb" in done.stderr


# ---- a planned run, pushed and launched through the local transport --------------------------

TRAIN = """\
import json, os, sys
names = json.loads(os.environ["EXPECT_NAMES"])
with open(os.path.join(os.environ["TFDEPLOY_OUTPUT_DIR"], "result.txt"), "w") as f:
    f.write("saved")
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": {k: os.environ.get(k) for k in names}}))
"""


def test_a_planned_launch_runs_with_hostile_args_and_env(tmp_path, run_id):
    canary = tmp_path / "pwned"
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text(TRAIN)
    workdir = tmp_path / "work dir"                   # a space in every path on the way
    inventory = parse_inventory(
        f"hosts:\n  - {{name: h, transport: local, workdir: '{workdir}', python: '{sys.executable}'}}\n",
        "h.yaml", environ={})
    (host,) = inventory.hosts
    env = {"HOSTILE": EnvValue(f"$(touch {canary}) `touch {canary}` ; 'q' \"dq\"\nline 2 ☃"),
           "SECRET": EnvValue("s3cr3t $HOME", secret=True), "EMPTY": EnvValue("")}
    names = sorted(["HOSTILE", "SECRET", "EMPTY", "TF_CONFIG", "TF_USE_LEGACY_KERAS",
                    "PYTHONUNBUFFERED", "TFDEPLOY_RUN_ID", "TFDEPLOY_TASK_INDEX",
                    "TFDEPLOY_NUM_WORKERS", "TFDEPLOY_OUTPUT_DIR"])
    env["EXPECT_NAMES"] = EnvValue(json.dumps(names))
    host = dataclasses.replace(host, env=env)
    args = ("--note", f"$(touch {canary})", "it's", "", "a  b", "line\nbreak", "`id`", "--", "*")
    plan = plan_run(Inventory("h.yaml", (host,)), Options(payload=str(payload), args=args),
                    run_id, {0: 23456})
    (hp,) = plan.hosts
    (task,) = hp.tasks
    transport = LocalTransport(host)

    push = PayloadPush(payload, "train.py", run_id)
    pushed = transport.run(hp.push.line, stdin=framed(push.stage))
    assert pushed.code == 0, pushed.stderr
    # A small new file rides along with the manifest: one round trip assembles the payload.
    answer = json.loads(pushed.stdout)
    assert answer["received"] == [f.sha256 for f in push.files] and answer["missing"] == []
    assert answer["assembled"] is True
    rundir = Path(hp.run_dir)
    assert json.loads((rundir / "run.json").read_text()) == {"run_id": run_id}

    started = transport.run(task.launch.line, stdin=task.launch.env_stdin())
    assert started.code == 0, started.stderr
    deadline = time.monotonic() + 15
    while True:
        answer = transport.run(poll_command(host, hp.run_dir, {0: 0}).line)
        status = json.loads(answer.stdout)["tasks"]["0"]
        if status["state"] in ("exited", "lost") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    log = base64.b64decode(status["data"]).decode()
    assert (status["state"], status["code"]) == ("exited", 0), log
    seen = json.loads(log)
    assert seen["argv"] == list(args)
    assert seen["cwd"] == f"{rundir}/payload"
    assert seen["env"] == {k: task.env[k].value for k in names}
    assert seen["env"]["SECRET"] == "s3cr3t $HOME"
    assert not canary.exists()

    fetched = transport.run(fetch_output_command(hp.run_dir).line)
    with tarfile.open(fileobj=io.BytesIO(fetched.stdout)) as tar:
        assert tar.extractfile("./result.txt").read() == b"saved"

    stopped = json.loads(transport.run(stop_command(host, hp.run_dir, 1).line).stdout)
    assert stopped == {"signalled": {}, "survivors": []}
    cleaned = json.loads(transport.run(cleanup_command(host, hp.run_dir, 1).line).stdout)
    assert cleaned["survivors"] == [] and not rundir.exists()
    assert (workdir / "runs").is_dir()
    # A second cleanup (the run dir is gone) answers instead of failing.
    again = transport.run(cleanup_command(host, hp.run_dir, 1).line)
    assert again.code == 0 and json.loads(again.stdout) == {"survivors": [], "absent": True}


def test_a_relaunch_sets_the_previous_attempt_aside_and_marks_the_log(rundir):
    first = launch(rundir, 0, "/bin/sh", "-c", "printf 'no newline at the end'; exit 3")
    assert poll_until_ended(rundir, 0)["code"] == 3
    second = launch(rundir, 0, "/bin/sh", "-c", "echo again", env={"TFDEPLOY_ATTEMPT": "2"})
    status = poll_until_ended(rundir, 0)
    # The new attempt's state, not the old exit file's; the old files are kept aside.
    assert (status["state"], status["code"], status["pid"]) == ("exited", 0, second["pid"])
    assert json.loads((rundir / "worker-0.pid.1").read_text()) == first
    assert json.loads((rundir / "worker-0.exit.1").read_text())["code"] == 3
    lines = (rundir / "worker-0.log").read_text().splitlines()
    assert lines[0] == "no newline at the end"
    assert lines[1].startswith("==== tfdeploy: attempt 2 of task 0 starts at ")
    assert lines[2:] == ["again"]


def test_stop_kills_a_group_that_ignores_term_without_waiting_the_grace(rundir, run_id):
    launch(rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('ready', flush=True); time.sleep(60)")
    launch(rundir, 1, "sleep", "60")
    wait_for_log(rundir, 0, b"ready\n")
    wait_for_processes(run_id, 4)
    started = time.monotonic()
    result = agent("stop", str(rundir), "30")
    took = time.monotonic() - started
    assert result == {"signalled": {"0": ["SIGTERM", "SIGKILL"], "1": ["SIGTERM"]},
                      "survivors": []}
    assert took < 15, f"stop waited {took:.1f} s: the 30 s grace was not cut short"
    assert processes_of_run(run_id) == []


def test_a_task_that_handles_term_keeps_its_grace(rundir, run_id):
    """A handler may be a graceful shutdown in progress: only SIG_IGN counts as deaf."""
    launch(rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', "
           "flush=True)); print('ready', flush=True); time.sleep(60)")
    wait_for_log(rundir, 0, b"ready\n")
    started = time.monotonic()
    result = agent("stop", str(rundir), "1.5")
    assert time.monotonic() - started >= 1.5
    assert result == {"signalled": {"0": ["SIGTERM", "SIGKILL"]}, "survivors": []}
    assert b"term\n" in (rundir / "worker-0.log").read_bytes()


def test_the_backup_is_replaced_from_an_archive_inside_the_run_dir_only(tmp_path, rundir):
    from deploy.plan.planner import fetch_backup_command, replace_backup_command
    source = tmp_path / "chief" / "runs" / rundir.name
    (source / "backup" / "chief").mkdir(parents=True)
    (source / "backup" / "chief" / "checkpoint").write_text("epoch 2")
    archive = subprocess.run(["/bin/sh", "-c", fetch_backup_command(str(source)).line],
                             capture_output=True, check=True).stdout
    (rundir / "backup" / "workertemp_1").mkdir(parents=True)
    (rundir / "backup" / "stale").write_text("old")
    subprocess.run(["/bin/sh", "-c", replace_backup_command(str(rundir)).line], input=archive,
                   check=True)
    assert sorted(str(p.relative_to(rundir)) for p in (rundir / "backup").rglob("*")) == [
        "backup/chief", "backup/chief/checkpoint"]
    assert (rundir / "run.json").exists()
    # A chief with no backup yet gives nothing; the host's backup is then emptied.
    nothing = subprocess.run(["/bin/sh", "-c", fetch_backup_command(str(tmp_path / "none")).line],
                             capture_output=True, check=True).stdout
    assert nothing == b""


def test_a_follower_stops_the_tasks_when_asked_on_its_stdin(rundir, run_id):
    launch(rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)
    follower = subprocess.Popen([*hostpkg.command(rundir), "follow", str(rundir), "0:0"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        # Asked only once it has reported the running task: a stop read before its first
        # look would leave nothing running to report.
        first = follower.stdout.readline()
        follower.stdin.write("stop 5\n")
        follower.stdin.flush()
        out, _ = follower.communicate(timeout=30)
        out = first + out
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    docs = [json.loads(line) for line in out.splitlines()]
    assert {"stopped": {"signalled": {"0": ["SIGTERM"]}, "survivors": []}} in docs
    states = [d["tasks"]["0"]["state"] for d in docs if "0" in d.get("tasks", {})]
    assert states[0] == "running" and states[-1] == "exited"
    assert processes_of_run(run_id) == []


def test_cleanup_stops_the_running_setup_step_by_its_recorded_group(rundir, run_id):
    """`inv setup` interrupted: the host's pip (here a stand-in that waits, as pip waiting on
    the network does) runs in its own process group recorded in build.pid; cleanup stops that
    group and only then deletes the directory."""
    ended: list[BaseException] = []

    def step() -> None:
        try:
            hostenv.run_logged([sys.executable, "-c", "import time; time.sleep(60)"],
                               str(rundir))
        except BaseException as exc:       # its group was stopped under it: expected
            ended.append(exc)
    thread = threading.Thread(target=step)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not (rundir / hostenv.BUILD_PID).exists() or not processes_of_run(run_id):
            assert time.monotonic() < deadline, "the step did not start"
            time.sleep(0.02)
        pid = json.loads((rundir / hostenv.BUILD_PID).read_text())["pgid"]
        assert os.getpgid(pid) == pid and os.getpgid(pid) != os.getpgid(0)
        result = agent("cleanup", str(rundir), "1")
        assert result["signalled"] == {"build": ["SIGTERM"]} and result["survivors"] == []
        assert not rundir.exists() and processes_of_run(run_id) == []
    finally:
        thread.join(10)
    assert ended and not thread.is_alive()
