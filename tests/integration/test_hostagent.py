"""The host's agent itself (deploy/host/boot.py, agent.py) and the controller's end of it
(deploy/cluster/hostagent.py), run locally: the package loaded from memory, error answers that leave
the agent serving, the beat of an idle agent, and a lost agent failing what waits on it."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import zipfile
from pathlib import Path

import pytest

import deploy.host
import hostpkg
from deploy.host.boot import ZipInMemory
from deploy.host.frames import read_frame
from deploy.plan.planner import AGENT_BOOT, follow_request
from deploy.cluster.hostagent import StepFailed, boot_stdin
from deploy.cluster.hostzip import host_zip

HOST_SOURCE = Path(deploy.host.__file__).parent


def in_memory() -> ZipInMemory:
    return ZipInMemory(zipfile.ZipFile(io.BytesIO(host_zip())))


def test_the_importer_gives_each_module_and_its_source_from_the_zip():
    importer = in_memory()
    assert importer.get_source("deploy.host.agent") == (HOST_SOURCE / "agent.py").read_text()
    assert importer.find_spec("deploy.host").submodule_search_locations is not None
    assert importer.find_spec("deploy.host.frames").origin == \
        "tfdeploy-host.zip/deploy/host/frames.py"
    assert importer.find_spec("deploy.host.nothing") is None
    assert importer.find_spec("json") is None           # the standard library is the host's


def test_a_module_run_from_memory_shows_its_source_in_a_traceback():
    """What a bug on a host reports: the lines of the code that failed, though no file has
    them there."""
    importer = in_memory()
    spec = importer.find_spec("deploy.host.frames")
    module = type(sys)("deploy.host.frames")
    module.__spec__, module.__loader__ = spec, importer
    importer.exec_module(module)
    try:
        module.read_frame(io.BytesIO(b"not json\n"))
    except Exception:                         # the module's own FrameError: not ours
        shown = traceback.format_exc()
    assert 'File "tfdeploy-host.zip/deploy/host/frames.py"' in shown
    assert 'raise FrameError("not a frame header: %r" % line[:200])' in shown


def test_the_boot_loads_the_package_from_memory_alone(tmp_path):
    """The agent's python as planned, but without site-packages (-S) and in an empty
    directory: nothing named deploy can be imported but what came on its stdin."""
    request = json.dumps({"id": 1, "verb": "ports", "args": ["2"], "home": []}).encode()
    agent = subprocess.Popen([sys.executable, "-I", "-S", "-c", AGENT_BOOT], cwd=tmp_path,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        agent.stdin.write(boot_stdin() + request + b"\n")
        agent.stdin.flush()
        while (answer := read_frame(agent.stdout)) is not None and answer.get("id") != 1:
            pass                                            # its beats
        agent.stdin.close()                                 # the controller is done: it ends
        agent.wait(30)
        err = agent.stderr.read()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert answer is not None and len(answer["ports"]) == 2, err
    assert list(tmp_path.iterdir()) == []                 # nothing written
    assert agent.returncode == 0 and err == b""


def test_an_unknown_verb_is_an_error_naming_it_and_the_agent_serves_on():
    with hostpkg.LocalAgent() as agent:
        with pytest.raises(StepFailed, match="h: explode failed: unknown request 'explode'"):
            agent.ask("explode", "x")
        assert len(agent.ask("ports", "1").ports) == 1


@pytest.mark.parametrize("verb, args, words", [
    ("poll", (), "poll failed: IndexError"),                 # no run directory at all
    ("stop", ("{run}", "soon"), "stop failed: could not convert string to float"),
    ("ports", ("many",), "ports failed: invalid literal for int()"),
    ("launch", ("/nowhere", "0", "/"), "launch failed:"),   # no `--` and no program
    ("credit", ("x",), "credit failed:"),
])
def test_a_request_with_bad_words_is_an_error_and_the_agent_serves_on(verb, args, words,
                                                                     tmp_path):
    args = [str(tmp_path) if word == "{run}" else word for word in args]
    with hostpkg.LocalAgent() as agent:
        with pytest.raises(StepFailed, match=words):
            agent.ask(verb, *args, timeout=10)
        assert len(agent.ask("ports", "1").ports) == 1


def test_an_idle_agent_beats():
    """An agent with nothing to answer still says so every second: the controller tells a
    silent host from an idle one."""
    with hostpkg.LocalAgent() as agent:
        agent.ask("ports", "1")
        longest, until = 0.0, time.monotonic() + 3.5
        while time.monotonic() < until:
            longest = max(longest, agent.agent.silent_for())
            time.sleep(0.1)
    print(f"longest silence of an idle agent: {longest:.2f} s")
    assert longest < 5


def test_a_lost_agent_fails_what_waits_and_what_is_asked_after(tmp_path):
    rundir = tmp_path / "runs" / "r1"
    rundir.mkdir(parents=True)
    (rundir / "run.json").write_text(json.dumps({"run_id": "r1"}))
    with hostpkg.LocalAgent() as agent:
        frames = []
        # A follow of a task that never starts: it waits for as long as the agent lives.
        waiting = agent.agent.ask(follow_request(str(rundir), {"0": 0}), "following",
                                  on_frame=frames.append)
        deadline = time.monotonic() + 10
        while not frames:
            assert time.monotonic() < deadline, "the follow never reported"
            time.sleep(0.02)
        os.killpg(agent.agent.stream.proc.pid, signal.SIGKILL)   # the agent this test started
        with pytest.raises(StepFailed, match=r"h: the connection was lost \(during: following\)"):
            waiting.wait(30)
        with pytest.raises(StepFailed, match="h: the connection was lost"):
            agent.ask("ports", "1", timeout=5)
    assert frames[0].tasks["0"].state == "pending"
