"""The host's agent (deploy/host/agent.py), started locally exactly as the controller starts
one (tests/hostpkg.py LocalAgent): launch, poll, follow, stop, cleanup as requests; and one
planned launch end to end through the local transport (no SSH, no network).

Every test uses its own run id, and whatever a test started is ended afterwards by pid: the
processes whose environment holds that run's TFDEPLOY_RUN_ID (tests/procs.py).
"""
from __future__ import annotations

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
import shutil
import uuid
from pathlib import Path

import pytest

import hostpkg
from deploy.host import venv as hostenv
from deploy.host import envkey
from deploy.host.archive import Limits
from deploy.host.protocol import (
    CleanupRequest, LaunchRequest, PollRequest, PortsRequest, StopRequest, Stopped, TaskStatus,
    Tasks, Unpacked
)
from deploy.host.agent import WINDOW
from deploy.host.teardown import run_processes
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import EnvValue, Inventory
from deploy.plan.planner import (
    Options, cleanup_request, credit_request, fetch_backup_request, fetch_output_request,
    follow_request, plan_run, poll_request, replace_backup_request, stop_request
)
from deploy.push.payload import PayloadPush
from deploy.run.follow import Followers
from deploy.cluster.hostagent import HostAgent, StepFailed
from deploy.transport.local import LocalTransport
from procs import ESCAPING_PAYLOAD, end, escaped_pids, processes_of_run, wait_until_gone


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


@pytest.fixture
def host():
    """The host's agent, started as the controller starts it (over the local transport)."""
    with hostpkg.LocalAgent() as agent:
        yield agent


def launch(host: hostpkg.LocalAgent, rundir: Path, task: int, *argv: str,
           env: dict | None = None, prefer: str | None = None) -> dict:
    return host.ask(LaunchRequest(str(rundir), str(task), str(rundir), argv, prefer),
                    TFDEPLOY_RUN_ID=rundir.name, **(env or {}))


def poll(host: hostpkg.LocalAgent, rundir: Path, task: int, offset: int = 0) -> dict:
    return host.ask(PollRequest(str(rundir), {str(task): offset})).tasks[str(task)]


def poll_until_ended(host: hostpkg.LocalAgent, rundir: Path, task: int,
                     timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = poll(host, rundir, task)
        if status.state in ("exited", "lost"):
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


def test_launch_records_exit_code_and_log(host, rundir, run_id):
    info = launch(host, rundir, 0, "/bin/sh", "-c", "echo hi; exit 4")
    assert info.pid == info.pgid and info.started > 0
    assert json.loads((rundir / "worker-0.pid").read_text()) == info.document()
    status = poll_until_ended(host, rundir, 0)
    assert (status.state, status.code, status.pid) == ("exited", 4, info.pid)
    assert status.data == b"hi\n"
    assert (status.offset, status.size) == (3, 3)
    assert status.ended >= status.started
    assert (rundir / "worker-0.log").read_bytes() == b"hi\n"
    assert json.loads((rundir / "worker-0.exit").read_text())["code"] == 4
    # Reading on from an offset gives only the rest.
    rest = poll(host, rundir, 0, offset=1)
    assert rest.data == b"i\n" and rest.offset == 3
    assert wait_until_gone(run_id, 5) == []       # the supervisor exits right after the task


@pytest.mark.parametrize("exists", [True, False])
def test_launch_prefers_the_setup_env_python_when_it_exists(host, rundir, tmp_path, exists):
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
    launch(host, rundir, 0, sys.executable, "-c", "import sys; print(sys.executable)",
           prefer=requirements)
    status = poll_until_ended(host, rundir, 0)
    assert status.code == 0
    ran = status.data.decode().strip()
    assert ran == (str(envpy) if exists else sys.executable)


def test_launch_passes_the_environment_of_the_request_and_runs_in_cwd(host, rundir):
    hostile = "a b 'c' \"d\" $(touch x) `id` ;\nnaïve"
    launch(host, rundir, 0, "/bin/sh", "-c",
           'printf "%s|%s|%s" "$GREETING" "$TFDEPLOY_RUN_ID" "$PWD"', env={"GREETING": hostile})
    status = poll_until_ended(host, rundir, 0)
    assert status.code == 0
    assert status.data.decode() == f"{hostile}|{rundir.name}|{rundir}"
    assert not (rundir / "x").exists()


def test_path_variables_are_expanded_and_created_on_the_host(rundir, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    # The agent runs with a private HOME, so ~/ is that directory, not this user's home.
    monkeypatch.setenv("HOME", str(home))
    with hostpkg.LocalAgent() as host:
        launch(host, rundir, 0, "/bin/sh", "-c", 'printf %s "$TFDEPLOY_OUTPUT_DIR"',
               env={"TFDEPLOY_OUTPUT_DIR": "~/out/put"})
        status = poll_until_ended(host, rundir, 0)
    assert status.data.decode() == f"{home}/out/put"
    assert (home / "out" / "put").is_dir()


def test_a_program_that_cannot_start_exits_127(host, rundir):
    launch(host, rundir, 0, str(rundir / "no-such-program"))
    status = poll_until_ended(host, rundir, 0)
    assert (status.state, status.code) == ("exited", 127)
    # The supervisor's shell says why, in the task's log: the program by its path.
    assert status.data.startswith(b"tfdeploy: ") and b"/no-such-program: " in status.data


def test_a_task_starts_with_the_signals_of_a_program_started_by_hand(host, rundir):
    # The supervisor traps TERM, INT and HUP, and Python (the agent) ignores PIPE and XFSZ:
    # the task ignores only what a program started from here ignores (what this test run
    # inherited), so a pipe whose reader has gone ends its writer without a word. A task a
    # signal ended leaves no line of its supervisor's shell ("Segmentation fault") in its log.
    shown = "grep '^SigIgn:' /proc/$$/status"
    by_hand = subprocess.run(["/bin/sh", "-c", shown], capture_output=True, check=True).stdout
    assert int(by_hand.split()[1], 16) & (1 << signal.SIGPIPE - 1 | 1 << signal.SIGXFSZ - 1) == 0
    launch(host, rundir, 0, "/bin/sh", "-c",
           f"{shown}; yes | head -c 2 >/dev/null; kill -SEGV $$")
    status = poll_until_ended(host, rundir, 0)
    assert (status.state, status.code) == ("exited", 128 + signal.SIGSEGV)
    assert status.data == by_hand


def test_poll_of_a_task_never_launched_is_pending(host, rundir):
    status = poll(host, rundir, 7)
    assert status == TaskStatus("pending", size=0, offset=0)


def test_poll_refuses_a_directory_that_is_not_a_run(host, tmp_path):
    with pytest.raises(StepFailed, match="poll failed: not a tfdeploy run directory"):
        host.ask(PollRequest(str(tmp_path), {"0": 0}))


def test_a_killed_supervisor_makes_the_task_lost(host, rundir):
    info = launch(host, rundir, 0, "sleep", "60")
    os.killpg(info.pgid, signal.SIGKILL)      # the whole group, as a crash or OOM would
    status = poll_until_ended(host, rundir, 0)
    assert status.state == "lost" and status.code is None


def test_one_poll_tells_each_of_a_hosts_tasks_apart(host, rundir, run_id):
    """One look at /proc answers for every task of the host: the running one, the one whose
    group was killed, the one that exited and the one never launched, each as it is."""
    running = launch(host, rundir, 0, "sleep", "60")
    killed = launch(host, rundir, 1, "sleep", "60")
    launch(host, rundir, 2, "/bin/sh", "-c", "exit 3")
    os.killpg(killed.pgid, signal.SIGKILL)
    poll_until_ended(host, rundir, 2)
    deadline = time.monotonic() + 10
    while True:
        tasks = host.ask(PollRequest(str(rundir), {str(t): 0 for t in range(4)})).tasks
        states = {t: (s.state, s.code) for t, s in tasks.items()}
        if states["1"][0] == "lost" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert states == {"0": ("running", None), "1": ("lost", None), "2": ("exited", 3),
                      "3": ("pending", None)}
    assert tasks["0"].pid == running.pid
    os.killpg(running.pgid, signal.SIGKILL)


def wait_for_processes(run_id: str, count: int, timeout: float = 10) -> None:
    """Until the supervisor and its task (both carry the run's marker) are running."""
    deadline = time.monotonic() + timeout
    while len(processes_of_run(run_id)) < count:
        assert time.monotonic() < deadline, "task did not start"
        time.sleep(0.02)


def test_stop_ends_a_sleeping_task_with_sigterm(host, rundir, run_id):
    info = launch(host, rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)                 # the supervisor and sleep
    result = host.ask(StopRequest(str(rundir), 1))
    assert result == Stopped(signalled={"0": ("SIGTERM",)})
    assert processes_of_run(run_id) == []
    status = poll_until_ended(host, rundir, 0)
    # The supervisor outlives the TERM and records how its child ended: 128 + SIGTERM.
    assert (status.state, status.code) == ("exited", 128 + signal.SIGTERM)
    assert status.pid == info.pid
    # Stopping again finds nothing to signal.
    assert host.ask(StopRequest(str(rundir), 1)) == Stopped()


def test_stop_escalates_to_kill_for_a_task_that_ignores_term(host, rundir, run_id):
    launch(host, rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('ready', flush=True); time.sleep(60)")
    wait_for_log(rundir, 0, b"ready\n")
    result = host.ask(StopRequest(str(rundir), 0.3))
    assert result == Stopped(signalled={"0": ("SIGTERM", "SIGKILL")})
    assert processes_of_run(run_id) == []
    assert poll_until_ended(host, rundir, 0).state in ("exited", "lost")


def test_stop_ends_the_processes_that_left_the_tasks_group(host, rundir, run_id):
    """One in a session of its own, one double-forked into a group of its own that ignores
    TERM: found by the run id in their environment, ended after the task's group."""
    launch(host, rundir, 0, sys.executable, "-c", ESCAPING_PAYLOAD, "--wait")
    wait_for_log(rundir, 0, b"escaped ")
    pids = escaped_pids((rundir / "worker-0.log").read_text())
    assert set(pids) < set(processes_of_run(run_id))
    result = host.ask(StopRequest(str(rundir), 5))
    assert list(result.escaped) == pids and result.survivors == ()
    assert result.signalled == {"0": ("SIGTERM",)}
    assert processes_of_run(run_id) == []


def test_stop_spares_other_runs_and_its_own_process(rundir, run_id, monkeypatch):
    """Another run whose id starts with this one's is not this run; the agent carrying the
    run's id (as it may on a local host) does not end itself."""
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, "TFDEPLOY_RUN_ID": run_id + "0"})
    monkeypatch.setenv("TFDEPLOY_RUN_ID", run_id)
    try:
        with hostpkg.LocalAgent() as agent:
            assert agent.ask(StopRequest(str(rundir), 1)) == Stopped()
            assert len(agent.ask(PortsRequest(1)).ports) == 1       # it is still there
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()



def test_a_run_is_found_by_an_environment_entry_of_its_own_wherever_it_stands(run_id):
    """The run's id as the first, a middle or the last entry of a process's environment is the
    run's; as a prefix of another id, inside another variable's value or in its name, not."""
    environments = {
        "first": {"TFDEPLOY_RUN_ID": run_id, "A": "1"},
        "middle": {"A": "1", "TFDEPLOY_RUN_ID": run_id, "B": "2"},
        "last": {"A": "1", "TFDEPLOY_RUN_ID": run_id},
        "prefix": {"TFDEPLOY_RUN_ID": run_id + "0"},
        "value": {"A": "TFDEPLOY_RUN_ID=" + run_id},
        "name": {"X_TFDEPLOY_RUN_ID": run_id},
    }
    procs = {what: subprocess.Popen(["sleep", "60"], env={"PATH": os.environ["PATH"], **env})
             for what, env in environments.items()}
    try:
        found = run_processes(run_id)
        assert {what for what, p in procs.items() if p.pid in found} == {"first", "middle",
                                                                         "last"}
        assert all(found[p.pid] == os.getpgid(p.pid) for p in procs.values() if p.pid in found)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


class Following:
    """A follow request through the controller's end of the agent (deploy/cluster/hostagent.py): its
    frames as they come; a credit for each frame taken, unless `credits` is False."""

    def __init__(self, agent: HostAgent, rundir: Path, offsets: dict[str, int],
                 credits: bool = True):
        self.agent, self.credits = agent, credits
        self.frames: list[Tasks] = []
        self.arrived = threading.Condition()
        self.ended = threading.Event()
        self.asked = threading.Event()        # a frame may come before ask() has returned
        self.reply = agent.ask(follow_request(str(rundir), offsets), "following",
                               on_frame=self._frame, on_end=lambda reply: self.ended.set())
        self.asked.set()

    def _frame(self, doc: Tasks) -> None:
        with self.arrived:
            self.frames.append(doc)
            self.arrived.notify_all()
        if self.credits:
            self.credit()

    def credit(self) -> None:
        self.asked.wait(10)
        self.agent.tell(credit_request(self.reply.number))

    def wait_for(self, count: int, timeout: float = 15) -> list[Tasks]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.frames) >= count, timeout), \
                f"{len(self.frames)} frames of {count}"
            return list(self.frames)

    def end(self, timeout: float = 30) -> Tasks:
        return self.reply.wait(timeout)


def test_follow_streams_until_every_task_has_ended(host, rundir):
    launch(host, rundir, 0, "/bin/sh", "-c", "echo one; sleep 0.3; echo two")
    launch(host, rundir, 1, "/bin/sh", "-c", "exit 3")
    following = Following(host.agent, rundir, {"0": 0, "1": 0})
    assert following.end() == Tasks(end=True)
    docs = following.frames
    logged = b"".join(d.tasks["0"].data for d in docs if "0" in d.tasks)
    assert logged == b"one\ntwo\n"
    finals = {}
    for doc in docs:
        finals.update(doc.tasks)
    assert {t: (s.state, s.code) for t, s in finals.items()} == {
        "0": ("exited", 0), "1": ("exited", 3)}


def test_a_follow_sends_at_most_its_window_ahead_of_the_credits(host, rundir, run_id):
    """A controller that takes no frame stops the host's follow after WINDOW frames; the logs
    wait on the host's disk, and each credit lets one more frame come."""
    launch(host, rundir, 0, "/bin/sh", "-c",
           "i=0; while :; do echo line $i; i=$((i+1)); sleep 0.05; done")
    following = Following(host.agent, rundir, {"0": 0}, credits=False)
    following.wait_for(WINDOW)
    time.sleep(0.5)              # ten more lines logged: frames beyond the window, were any sent
    assert len(following.frames) == WINDOW and not following.ended.is_set()
    assert host.ask(PollRequest(str(rundir), {"0": 0})).tasks["0"].state == "running"  # still answers
    following.credit()
    following.credit()
    assert len(following.wait_for(WINDOW + 2)) == WINDOW + 2
    time.sleep(0.3)
    assert len(following.frames) == WINDOW + 2
    assert host.ask(StopRequest(str(rundir), 5)).signalled == {"0": ("SIGTERM",)}
    following.credits = True     # from now on every frame taken is credited, as Followers do
    for _ in range(WINDOW):
        following.credit()
    assert following.end() == Tasks(end=True)
    logged = b"".join(d.tasks["0"].data for d in following.frames if "0" in d.tasks)
    assert logged == (rundir / "worker-0.log").read_bytes() and logged.count(b"\n") > 10


def test_followers_take_a_flood_of_frames_crediting_each_and_a_stop_through_them(
        tmp_path, run_id):
    """deploy/run/follow.py as a run uses it: every frame taken from the queue lets the agent
    send one more, so a log of many frames arrives whole; a stop asked through the followers
    is answered as a document (its answer and the follow's end come in either order)."""
    host = hostpkg.local_host(str(tmp_path / "work"))
    plan = plan_run(Inventory("h.yaml", (dataclasses.replace(host, workers=2),)),
                    Options(), run_id, {0: 1, 1: 2})
    (hp,) = plan.hosts
    rundir = Path(hp.run_dir)
    (rundir / "payload").mkdir(parents=True)
    (rundir / "run.json").write_text(json.dumps({"run_id": run_id}))
    with hostpkg.LocalAgent(host) as local:
        # 6 MiB of log: at least six frames (a frame carries at most MAX_CHUNK of a task's
        # log), more than the window however fast the log is written.
        flood = local.ask(LaunchRequest(str(rundir), "0", str(rundir), (
            sys.executable, "-c",
            "import sys\nfor i in range(6144): sys.stdout.write('x' * 1023 + '\\n')")),
            TFDEPLOY_RUN_ID=run_id)
        local.ask(LaunchRequest(str(rundir), "1", str(rundir), ("sleep", "60")),
                  TFDEPLOY_RUN_ID=run_id)
        followers = Followers(plan, {"h": local.agent})
        followers.start_all({0: 0, 1: 0})
        logged, frames, stopped, ended = b"", 0, None, False
        deadline = time.monotonic() + 30
        while not (ended and stopped) and time.monotonic() < deadline:
            event = followers.next(1.0)
            if event is None:
                continue
            assert event.kind != "error", event.error
            if event.kind == "end":
                ended = True
            elif event.kind == "stopped":
                stopped = event.stopped
            else:
                frames += 1
                status = event.tasks.tasks.get("0")
                logged += status.data if status else b""
                if status and status.state == "exited" and status.offset >= status.size \
                        and stopped is None:
                    assert followers.send_stop(5) == []
                    stopped = {}
        followers.close()
    assert ended and flood.pid > 0
    assert logged == (rundir / "worker-0.log").read_bytes() == (b"x" * 1023 + b"\n") * 6144
    assert frames >= 6 > WINDOW  # more than the window: the credits kept the follow going
    # Task 1 was running; task 0's supervisor may still have been on its way out.
    assert stopped.signalled["1"] == ("SIGTERM",) and stopped.survivors == ()


def test_cleanup_refuses_a_directory_not_named_after_its_run(host, rundir, tmp_path, run_id):
    impostor = tmp_path / "work" / "runs" / "other-name"
    impostor.mkdir()
    (impostor / "run.json").write_text(json.dumps({"run_id": run_id}))
    with pytest.raises(StepFailed, match="refusing to delete"):
        host.ask(CleanupRequest(str(impostor), 1))
    assert (impostor / "run.json").exists()
    # Named after the run, but not below a runs/ directory.
    stray = tmp_path / "elsewhere" / run_id
    stray.mkdir(parents=True)
    (stray / "run.json").write_text(json.dumps({"run_id": run_id}))
    with pytest.raises(StepFailed, match="refusing to delete"):
        host.ask(CleanupRequest(str(stray), 1))
    assert stray.exists()
    # No run.json at all.
    bare = tmp_path / "work" / "runs" / "bare"
    bare.mkdir()
    with pytest.raises(StepFailed, match="not a tfdeploy run directory"):
        host.ask(CleanupRequest(str(bare), 1))
    assert bare.exists()


def test_cleanup_stops_the_run_and_removes_its_directory(host, rundir, tmp_path, run_id):
    launch(host, rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)
    (rundir / "output").mkdir()
    (rundir / "output" / "model.bin").write_bytes(b"\0" * 10)
    result = host.ask(CleanupRequest(str(rundir), 1))
    assert result.survivors == () and result.removed == os.path.realpath(rundir)
    assert result.signalled == {"0": ("SIGTERM",)}
    assert not rundir.exists()
    assert (tmp_path / "work" / "runs").is_dir()       # only the run's own directory goes
    assert processes_of_run(run_id) == []


def test_cleanup_of_a_run_directory_its_run_json_left_takes_the_run_named(host, rundir,
                                                                          run_id):
    # What a host back after it was lost leaves on a shared workdir once the run removed its
    # directory: a task of the run writing its backup again, without run.json.
    shutil.rmtree(rundir)
    (rundir / "backup").mkdir(parents=True)
    (rundir / "backup" / "checkpoint").write_bytes(b"\0" * 10)
    writer = subprocess.Popen(["sleep", "60"], env={**os.environ, "TFDEPLOY_RUN_ID": run_id},
                              start_new_session=True)
    try:
        wait_for_processes(run_id, 1)
        for named in (None, "other-run"):          # the controller names no run, or another
            with pytest.raises(StepFailed, match="not a tfdeploy run directory"):
                host.ask(CleanupRequest(str(rundir), 1, None, named))
            assert (rundir / "backup" / "checkpoint").exists()
        result = host.ask(CleanupRequest(str(rundir), 1, None, run_id))
        assert result.removed == os.path.realpath(rundir) and result.survivors == ()
        assert not rundir.exists() and processes_of_run(run_id) == []
        assert writer.wait(timeout=10) == -signal.SIGTERM
    finally:
        end(writer)


def test_unknown_verb_fails(host, rundir):
    with pytest.raises(StepFailed, match="unknown request 'explode'"):
        host.ask(hostpkg.Unchecked("explode"))


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
    agent = HostAgent(host, transport)
    try:
        push = PayloadPush(payload, "train.py", run_id)
        answer = agent.ask(hp.push, "push", push.stage).wait(60)
        # A small new file rides along with the manifest: one round trip assembles the payload.
        assert answer.received == tuple(f.sha256 for f in push.files) and answer.missing == ()
        assert answer.assembled is True
        rundir = Path(hp.run_dir)
        assert json.loads((rundir / "run.json").read_text()) == {"run_id": run_id}

        agent.ask(task.launch, "launch").wait(30)
        deadline = time.monotonic() + 15
        while True:
            status = agent.ask(poll_request(hp.run_dir, {"0": 0}), "poll").wait(30).tasks["0"]
            if status.state in ("exited", "lost") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        log = status.data.decode()
        assert (status.state, status.code) == ("exited", 0), log
        seen = json.loads(log)
        assert seen["argv"] == list(args)
        assert seen["cwd"] == f"{rundir}/payload"
        assert seen["env"] == {k: task.env[k].value for k in names}
        assert seen["env"]["SECRET"] == "s3cr3t $HOME"
        assert not canary.exists()

        fetched = hostpkg.fetched(agent, fetch_output_request(hp.run_dir, Limits()), tmp_path)
        with tarfile.open(fileobj=io.BytesIO(fetched)) as tar:
            assert tar.extractfile("./result.txt").read() == b"saved"

        assert wait_until_gone(run_id, 5) == []      # the supervisor, too, has exited
        stopped = agent.ask(stop_request(hp.run_dir, 1), "stop").wait(30)
        assert stopped == Stopped()
        cleaned = agent.ask(cleanup_request(host, hp.run_dir, 1), "cleanup").wait(30)
        assert cleaned.survivors == () and not rundir.exists()
        assert (workdir / "runs").is_dir()
        # A second cleanup (the run dir is gone) answers instead of failing.
        again = agent.ask(cleanup_request(host, hp.run_dir, 1), "cleanup").wait(30)
        assert again == Stopped(absent=True)
    finally:
        agent.close()
        transport.close()


def test_a_relaunch_sets_the_previous_attempt_aside_and_marks_the_log(host, rundir):
    first = launch(host, rundir, 0, "/bin/sh", "-c", "printf 'no newline at the end'; exit 3")
    assert poll_until_ended(host, rundir, 0).code == 3
    second = launch(host, rundir, 0, "/bin/sh", "-c", "echo again",
                    env={"TFDEPLOY_ATTEMPT": "2"})
    status = poll_until_ended(host, rundir, 0)
    # The new attempt's state, not the old exit file's; the old files are kept aside.
    assert (status.state, status.code, status.pid) == ("exited", 0, second.pid)
    assert json.loads((rundir / "worker-0.pid.1").read_text()) == first.document()
    assert json.loads((rundir / "worker-0.exit.1").read_text())["code"] == 3
    lines = (rundir / "worker-0.log").read_text().splitlines()
    assert lines[0] == "no newline at the end"
    assert lines[1].startswith("==== tfdeploy: attempt 2 of task 0 starts at ")
    assert lines[2:] == ["again"]


def test_stop_kills_a_group_that_ignores_term_without_waiting_the_grace(host, rundir, run_id):
    launch(host, rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('ready', flush=True); time.sleep(60)")
    launch(host, rundir, 1, "sleep", "60")
    wait_for_log(rundir, 0, b"ready\n")
    wait_for_processes(run_id, 4)
    started = time.monotonic()
    result = host.ask(StopRequest(str(rundir), 30))
    took = time.monotonic() - started
    assert result == Stopped(signalled={"0": ("SIGTERM", "SIGKILL"), "1": ("SIGTERM",)})
    assert took < 15, f"stop waited {took:.1f} s: the 30 s grace was not cut short"
    assert processes_of_run(run_id) == []


def test_a_task_that_handles_term_keeps_its_grace(host, rundir, run_id):
    """A handler may be a graceful shutdown in progress: only SIG_IGN counts as deaf."""
    launch(host, rundir, 0, sys.executable, "-c",
           "import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('term', "
           "flush=True)); print('ready', flush=True); time.sleep(60)")
    wait_for_log(rundir, 0, b"ready\n")
    started = time.monotonic()
    result = host.ask(StopRequest(str(rundir), 1.5))
    assert time.monotonic() - started >= 1.5
    assert result == Stopped(signalled={"0": ("SIGTERM", "SIGKILL")})
    assert b"term\n" in (rundir / "worker-0.log").read_bytes()


def test_the_backup_is_replaced_from_an_archive_inside_the_run_dir_only(host, tmp_path, rundir):
    source = tmp_path / "chief" / "runs" / rundir.name
    (source / "backup" / "chief").mkdir(parents=True)
    (source / "backup" / "chief" / "checkpoint").write_text("epoch 2")
    archive = hostpkg.fetched(host.agent, fetch_backup_request(str(source), Limits(), {}), tmp_path)
    (rundir / "backup" / "workertemp_1").mkdir(parents=True)
    (rundir / "backup" / "stale").write_text("old")
    answer = host.agent.ask(replace_backup_request(str(rundir), Limits()), "replace",
                            archive).wait(30)
    assert answer == Unpacked(files=1)
    assert sorted(str(p.relative_to(rundir)) for p in (rundir / "backup").rglob("*")) == [
        "backup/chief", "backup/chief/checkpoint"]
    assert (rundir / "run.json").exists()
    # A chief with no backup yet gives nothing; the host's backup is then emptied.
    assert hostpkg.fetched(host.agent, fetch_backup_request(str(tmp_path / "none"), Limits(), {}),
                           tmp_path) == b""
    # Only a run's own directory has its backup replaced (the chief's here has no run.json).
    with pytest.raises(StepFailed, match="not a tfdeploy run directory"):
        host.agent.ask(replace_backup_request(str(source), Limits()), "replace",
                       archive).wait(30)
    assert (source / "backup" / "chief" / "checkpoint").read_text() == "epoch 2"


def test_a_stop_asked_while_following_ends_the_tasks_and_the_follow(host, rundir, run_id):
    launch(host, rundir, 0, "sleep", "60")
    wait_for_processes(run_id, 2)
    following = Following(host.agent, rundir, {"0": 0})
    # Asked only once the follow has reported the running task: a stop before its first look
    # would leave nothing running to report.
    following.wait_for(1)
    stopped = host.agent.ask(stop_request(str(rundir), 5), "stopping").wait(30)
    assert stopped == Stopped(signalled={"0": ("SIGTERM",)})
    assert following.end() == Tasks(end=True)
    states = [d.tasks["0"].state for d in following.frames if "0" in d.tasks]
    assert states[0] == "running" and states[-1] == "exited"
    assert processes_of_run(run_id) == []


def test_cleanup_stops_the_running_setup_step_by_its_recorded_group(host, rundir, run_id):
    """`inv setup` interrupted: the host's pip (here a stand-in that waits, as pip waiting on
    the network does) runs in its own process group recorded in build.pid; cleanup stops that
    group and only then deletes the directory."""
    ended: list[BaseException] = []

    def step() -> None:
        try:
            hostenv.run_logged([sys.executable, "-c", "import time; time.sleep(60)"],
                               str(rundir), lambda event: None)
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
        result = host.ask(CleanupRequest(str(rundir), 1))
        assert result.signalled == {"build": ("SIGTERM",)} and result.survivors == ()
        assert not rundir.exists() and processes_of_run(run_id) == []
    finally:
        thread.join(10)
    assert ended and not thread.is_alive()
