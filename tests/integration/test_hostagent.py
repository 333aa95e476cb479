"""The host's agent itself (deploy/host/boot.py, agent.py) and the controller's end of it
(deploy/cluster/hostagent.py), run locally: the package loaded from memory, error answers that leave
the agent serving, the beat of an idle agent, and a lost agent failing what waits on it."""
from __future__ import annotations

import io
import json
import marshal
import re
import os
import stat
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

import deploy.host
import hostpkg
from deploy.cluster.session import Session
from deploy.host import layout
from deploy.host.archive import Limits, unpack
from deploy.inventory.model import Inventory
from deploy.host.protocol import PortsRequest
from deploy.host import boot
from deploy.host.boot import SourcesInMemory, unpacked
from deploy.host.frames import read_frame
from deploy.plan.planner import AGENT_BOOT, Options, follow_request, plan_run
from deploy.cluster.hostagent import StepFailed, boot_stdin
from deploy.cluster.hostcode import host_sources

HOST_SOURCE = Path(deploy.host.__file__).parent


def in_memory() -> SourcesInMemory:
    return SourcesInMemory(unpacked(host_sources()))


def test_the_importer_gives_each_module_and_its_source_from_memory():
    importer = in_memory()
    assert importer.get_source("deploy.host.agent") == (HOST_SOURCE / "agent.py").read_text()
    assert importer.find_spec("deploy.host").submodule_search_locations is not None
    assert importer.find_spec("deploy.host.frames").origin == \
        "tfdeploy-host/deploy/host/frames.py"
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
    assert 'File "tfdeploy-host/deploy/host/frames.py"' in shown
    assert 'raise FrameError("not a frame header: %r" % line[:200])' in shown


def test_the_boot_loads_the_package_from_memory_alone(tmp_path):
    """The agent's python as planned, but without site-packages (-S) and in an empty
    directory: nothing named deploy can be imported but what came on its stdin."""
    request = json.dumps({"id": 1, "verb": "ports", "fields": {"count": 2}, "home": []}).encode()
    agent = subprocess.Popen([sys.executable, "-I", "-S", "-c", AGENT_BOOT], cwd=tmp_path,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        agent.stdin.write(boot_stdin(str(tmp_path / "work")) + request + b"\n")
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


def boot_input(package: bytes, folder: Path) -> io.BytesIO:
    """What boot.py reads after itself: the package, then the folder of its compiled code."""
    where = str(folder).encode()
    return io.BytesIO(b"%d\n" % len(package) + package + b"%d\n" % len(where) + where)


def test_the_code_an_agent_keeps_is_what_the_next_agent_runs(tmp_path):
    package, folder = host_sources(), tmp_path / "work" / "cache" / "agent"
    folder.parent.mkdir(parents=True)
    first = boot.importer_of(boot_input(package, folder))
    assert first.compiled == {}                                   # nothing kept yet
    first.keep()
    [kept] = folder.iterdir()
    assert kept.name == boot.code_name(package) and kept.name.endswith(".code")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    second = boot.importer_of(boot_input(package, folder))
    assert set(second.compiled) == set(second.sources)
    # The next agent runs the kept code, not its sources: a module whose source would fail
    # loads, and a second keep() leaves the file as it was.
    second.sources = {**second.sources, "deploy/host/frames.py": "raise AssertionError\n"}
    module = type(sys)("deploy.host.frames")
    module.__spec__ = second.find_spec("deploy.host.frames")
    second.exec_module(module)
    assert callable(module.read_frame)
    before = kept.stat().st_mtime_ns
    second.keep()
    assert kept.stat().st_mtime_ns == before
    # Another package's code for this Python replaces it; another Python's stays.
    (folder / "otherpython-0123.code").write_bytes(b"x")
    other = boot.importer_of(boot_input(package + b" ", folder))
    other.keep()
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [boot.code_name(package + b" "), "otherpython-0123.code"])


@pytest.mark.parametrize("spoil", ["group-writable", "not marshal", "not code", "link"])
def test_kept_code_that_is_not_as_keep_wrote_it_is_not_run(tmp_path, spoil):
    package, folder = host_sources(), tmp_path / "cache" / "agent"
    folder.parent.mkdir()
    boot.importer_of(boot_input(package, folder)).keep()
    kept = folder / boot.code_name(package)
    good = kept.read_bytes()
    kept.unlink()
    if spoil == "group-writable":
        kept.write_bytes(good)
        kept.chmod(0o620)
    elif spoil == "not marshal":
        kept.write_bytes(good[:len(good) // 2])
    elif spoil == "not code":
        kept.write_bytes(marshal.dumps({"deploy/host/frames.py": "print('not code')"}))
    else:
        (tmp_path / "elsewhere.code").write_bytes(good)
        kept.symlink_to(tmp_path / "elsewhere.code")
    assert boot.importer_of(boot_input(package, folder)).compiled == {}


def test_an_unknown_verb_is_an_error_naming_it_and_the_agent_serves_on():
    with hostpkg.LocalAgent() as agent:
        with pytest.raises(StepFailed, match="h: explode failed: unknown request 'explode'"):
            agent.ask(hostpkg.Unchecked("explode"))
        assert len(agent.ask(PortsRequest(1)).ports) == 1


@pytest.mark.parametrize("verb, fields, words", [
    ("poll", {}, "poll failed: bad request for poll: fields.rundir is missing"),
    ("stop", {"rundir": "{run}", "grace": "soon"},
     "stop failed: bad request for stop: fields.grace is not a finite number: 'soon'"),
    ("ports", {"count": "many"}, "fields.count is not an integer: 'many'"),
    ("ports", {"count": 1, "more": 2}, "fields.more is not a field of ports"),
    ("launch", {"rundir": "/nowhere", "task": "0", "cwd": "/"}, "fields.argv is missing"),
    ("launch", {"rundir": "{run}", "task": "../x", "cwd": "/", "argv": ["true"]},
     "launch failed: not a task: '../x'"),
    ("credit", {"follow": "x"}, "credit failed: bad request for credit: fields.follow"),
])
def test_a_request_with_bad_fields_is_an_error_naming_the_field_and_the_agent_serves_on(
        verb, fields, words, tmp_path):
    fields = {k: str(tmp_path) if v == "{run}" else v for k, v in fields.items()}
    with hostpkg.LocalAgent() as agent:
        with pytest.raises(StepFailed, match=re.escape(words)):
            agent.ask(hostpkg.Unchecked(verb, fields), timeout=10)
        assert len(agent.ask(PortsRequest(1)).ports) == 1


def test_an_idle_agent_beats():
    """An agent with nothing to answer still says so every second: the controller tells a
    silent host from an idle one."""
    with hostpkg.LocalAgent() as agent:
        agent.ask(PortsRequest(1))
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
            agent.ask(PortsRequest(1), timeout=5)
    assert frames[0].tasks["0"].state == "pending"


def test_a_backup_copy_brings_only_what_changed_since_the_last(tmp_path):
    """Session.keep_backup twice through a real agent: the second copy, after one small file
    of the chief's backup changed, brings that file alone; the copy equals the backup."""
    inventory = Inventory("hosts.yaml", (hostpkg.local_host(str(tmp_path / "w")),))
    (hp,) = plan_run(inventory, Options(), "20261205-000000-abcdef").hosts
    backup = Path(hp.run_dir) / layout.BACKUP
    (backup / "chief").mkdir(parents=True)
    (backup / "chief" / "checkpoint").write_text("model_checkpoint_path: 1\n")
    (backup / "static.bin").write_bytes(os.urandom(1 << 20))
    kept, limits = tmp_path / "local" / "chief.tar.gz", Limits(1 << 30, 1000)
    with hostpkg.LocalAgent(hp.host) as agent:
        session = Session({hp.host.name: agent.transport}, {hp.host.name: agent.agent})
        first = session.keep_backup(hp, limits, kept)
        (backup / "chief" / "checkpoint").write_text("model_checkpoint_path: 22\n")
        second = session.keep_backup(hp, limits, kept)
    print(f"first copy: {first} bytes; after one small file changed: {second} bytes")
    assert first > 1 << 20 and 0 < second < 4096
    with kept.open("rb") as archive:
        unpack(archive, str(tmp_path / "copy"), limits)
    assert (tmp_path / "copy" / "chief" / "checkpoint").read_text() == \
        "model_checkpoint_path: 22\n"
    assert (tmp_path / "copy" / "static.bin").read_bytes() == \
        (backup / "static.bin").read_bytes()
