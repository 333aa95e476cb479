"""The host side of the incremental push (deploy/host/cache.py), run here on temp dirs:
what the cache lacks, verified receipt, and payload/ assembled atomically from the cache."""
from __future__ import annotations

import fcntl
import io
import json
import os
import stat
from pathlib import Path

import pytest

import hostpkg
from deploy.host import cache as hostcache
from deploy.host.stage import unpack_stage
from deploy.host.protocol import PushRequest, Pushed, ReceiveRequest
from deploy.plan.command import Request
from deploy.push.bundle import FileStream, manifest, manifest_document, stage_tar
from deploy.cluster.hostagent import StepFailed


@pytest.fixture
def payload(tmp_path):
    root = tmp_path / "payload"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "a.py").write_text("A = 1\n")
    (root / "pkg" / "same.py").write_text("A = 1\n")       # same content: cached once
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def new_run(tmp_path: Path, payload: Path, name: str):
    rundir = tmp_path / "work" / "runs" / name
    rundir.mkdir(parents=True)
    files = manifest(payload, "train.py")
    (rundir / "manifest.json").write_text(json.dumps(manifest_document(files)))
    return rundir, files


def push(tmp_path, payload, name):
    """want + receive as the controller drives them; returns (want answer, receive answer)."""
    cache = tmp_path / "work" / "cache"
    rundir, files = new_run(tmp_path, payload, name)
    wanted = hostcache.want(str(rundir), str(cache))
    if wanted.get("assembled"):          # nothing missing: payload/ is there already
        return rundir, wanted, {"received": []}
    data = b"".join(FileStream(payload, files, set(wanted["missing"])))
    got = hostcache.receive(str(rundir), str(cache), io.BytesIO(data))
    return rundir, wanted, got


def test_first_push_sends_each_content_once_and_assembles_the_payload(tmp_path, payload):
    rundir, wanted, got = push(tmp_path, payload, "r1")
    assert wanted["files"] == 4 and len(wanted["missing"]) == 3      # a.py == same.py
    assert sorted(got["received"]) == wanted["missing"] and got["files"] == 4
    out = rundir / "payload"
    assert (out / "pkg" / "same.py").read_text() == "A = 1\n"
    assert (out / "train.py").read_text() == "print('hi')\n"
    assert os.access(out / "run.sh", os.X_OK)
    assert not stat.S_IMODE((out / "train.py").stat().st_mode) & 0o222   # read-only link
    assert [p.name for p in rundir.iterdir() if p.name.startswith(".payload-")] == []
    cached = sorted(p.name for p in (tmp_path / "work" / "cache" / "files").iterdir())
    assert cached == wanted["missing"]


def test_second_push_after_a_one_file_change_sends_exactly_that_file(tmp_path, payload):
    push(tmp_path, payload, "r1")
    rundir, wanted, got = push(tmp_path, payload, "r2")
    assert wanted == {"missing": [], "received": [], "files": 4, "assembled": True}
    assert (rundir / "payload" / "pkg" / "a.py").read_text() == "A = 1\n"
    (payload / "pkg" / "a.py").write_text("A = 2\n")
    rundir, wanted, got = push(tmp_path, payload, "r3")
    assert len(wanted["missing"]) == 1 and got["received"] == wanted["missing"]
    assert (rundir / "payload" / "pkg" / "a.py").read_text() == "A = 2\n"
    assert (rundir / "payload" / "pkg" / "same.py").read_text() == "A = 1\n"


def test_content_with_the_wrong_hash_is_refused_and_never_cached(tmp_path, payload):
    cache = tmp_path / "work" / "cache"
    rundir, files = new_run(tmp_path, payload, "r1")
    missing = hostcache.want(str(rundir), str(cache))["missing"]
    size = next(f.size for f in files if f.sha256 == missing[0])
    evil = b"e" * size
    stream = hostcache.MAGIC + f"{missing[0]} {size}\n".encode() + evil + hostcache.END
    with pytest.raises(hostcache.CacheError, match="arrived with hash"):
        hostcache.receive(str(rundir), str(cache), io.BytesIO(stream))
    assert list((cache / "files").iterdir()) == [] and list((cache / "tmp").iterdir()) == []
    assert not (rundir / "payload").exists()


def test_an_interrupted_stream_leaves_no_payload_and_only_verified_files(tmp_path, payload):
    cache = tmp_path / "work" / "cache"
    rundir, files = new_run(tmp_path, payload, "r1")
    missing = hostcache.want(str(rundir), str(cache))["missing"]
    data = b"".join(FileStream(payload, files, set(missing)))
    order = list(dict.fromkeys(f.sha256 for f in files))        # the stream's order
    # The first file whole, the second's header and 3 of its bytes: a transfer cut short.
    header2 = data.index(order[1].encode())
    cut = data[:data.index(b"\n", header2) + 1 + 3]
    with pytest.raises(hostcache.CacheError, match="cut short"):
        hostcache.receive(str(rundir), str(cache), io.BytesIO(cut))
    assert not (rundir / "payload").exists()
    assert len(list((cache / "files").iterdir())) == 1
    # The next attempt asks only for what is still missing, and completes.
    again = hostcache.want(str(rundir), str(cache))["missing"]
    assert len(again) == len(missing) - 1
    stream = b"".join(FileStream(payload, files, set(again)))
    hostcache.receive(str(rundir), str(cache), io.BytesIO(stream))
    assert (rundir / "payload" / "run.sh").read_text() == "#!/bin/sh\n"


def test_a_stream_file_not_in_the_manifest_is_refused(tmp_path, payload):
    rundir, _ = new_run(tmp_path, payload, "r1")
    stream = hostcache.MAGIC + b"../../escape 0\n" + hostcache.END
    with pytest.raises(hostcache.CacheError, match="unexpected file"):
        hostcache.receive(str(rundir), str(tmp_path / "cache"), io.BytesIO(stream))
    with pytest.raises(hostcache.CacheError, match="does not start with"):
        hostcache.receive(str(rundir), str(tmp_path / "cache"), io.BytesIO(b"PK\3\4"))


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "a//b", "./a"])
def test_a_manifest_path_leaving_the_payload_is_refused(tmp_path, path):
    rundir = tmp_path / "r"
    rundir.mkdir()
    (rundir / "manifest.json").write_text(json.dumps({"files": [[path, "a" * 64, 0o644, 0]]}))
    with pytest.raises(hostcache.CacheError, match="bad manifest entry"):
        hostcache.want(str(rundir), str(tmp_path / "cache"))


def test_the_agent_answers_push_and_receive_from_the_run_dir(tmp_path, payload):
    """As on a host: the host's agent, from memory in isolated mode, asked a push with its
    stage (the manifest), then sent the files it lacks; a stream that is not one is refused
    and a new agent serves on."""
    rundir = tmp_path / "work" / "runs" / "r1"
    files = manifest(payload, "train.py")
    cache = str(tmp_path / "work" / "cache")
    with hostpkg.LocalAgent() as agent:
        want = agent.ask(PushRequest(str(rundir), cache), body=stage_tar("r1", files))
        missing = want.missing
        assert json.loads((rundir / "manifest.json").read_text()) == manifest_document(files)
        assert len(missing) == 3 and want.received == () and not want.assembled
        got = agent.agent.ask(Request(ReceiveRequest(str(rundir), cache)), "receive",
                              files=FileStream(payload, files, set(missing))).wait(30)
        assert sorted(got.received) == sorted(missing) and got.files == 4
        assert (rundir / "payload" / "pkg" / "a.py").read_text() == "A = 1\n"
        refused = agent.agent.ask(Request(ReceiveRequest(str(rundir), cache)), "receive",
                                  files=[b"not a file stream\n"])
        with pytest.raises(StepFailed, match="receive failed: payload receive: the file stream "
                                             "does not start"):
            refused.wait(30)
        # That agent stopped reading (the rest of a bad stream is not requests); a new one
        # takes over, as Session.push has it.
        agent.agent.resync(refused)
        assert agent.ask(PushRequest(str(rundir), cache), body=stage_tar("r1", files)).assembled


def test_files_riding_with_the_manifest_are_verified_cached_and_spare_a_round_trip(tmp_path,
                                                                                    payload):
    push(tmp_path, payload, "r1")
    (payload / "pkg" / "a.py").write_text("A = 3\n")
    cache = tmp_path / "work" / "cache"
    rundir, files = new_run(tmp_path, payload, "r2")
    changed = next(f for f in files if f.path == "pkg/a.py")
    before = sorted(os.listdir(rundir))
    wanted = hostcache.want(str(rundir), str(cache), riders={changed.sha256: b"A = 3\n"})
    assert wanted == {"missing": [], "received": [changed.sha256], "files": 4, "assembled": True}
    assert (rundir / "payload" / "pkg" / "a.py").read_text() == "A = 3\n"
    assert sorted(os.listdir(rundir)) == sorted(before + ["payload"])
    assert os.listdir(cache / "tmp") == []


def test_a_rider_with_the_wrong_content_or_not_in_the_manifest_is_refused(tmp_path, payload):
    cache = tmp_path / "work" / "cache"
    rundir, files = new_run(tmp_path, payload, "r1")
    with pytest.raises(hostcache.CacheError, match="arrived with hash"):
        hostcache.want(str(rundir), str(cache), riders={files[0].sha256: b"x" * files[0].size})
    with pytest.raises(hostcache.CacheError, match="unexpected inline file"):
        hostcache.want(str(rundir), str(cache), riders={"ab" * 32: b"x"})
    assert list((cache / "files").iterdir()) == [] and not (rundir / "payload").exists()


def test_the_stage_hands_its_riders_to_the_cache_and_writes_none_into_the_run_dir(tmp_path,
                                                                                   payload):
    """Hosts sharing a workdir unpack one stage into one run directory at once: the riders
    must never appear there, where another host would list them."""
    files = manifest(payload, "train.py")
    rider = next(f for f in files if f.path == "train.py")
    rundir = tmp_path / "work" / "runs" / "r1"
    riders = unpack_stage(str(rundir), stage_tar("r1", files, [rider], payload))
    assert riders == {rider.sha256: b"print('hi')\n"}
    assert sorted(os.listdir(rundir)) == ["manifest.json", "run.json"]
    again = unpack_stage(str(rundir), stage_tar("r1", files, [rider], payload))
    assert again == riders and sorted(os.listdir(rundir)) == ["manifest.json", "run.json"]


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="Linux only")
def test_the_stream_from_sshd_is_read_through_a_wider_pipe():
    """sshd's 64 KiB pipe filled whenever the host stopped reading to create a file, and the
    sender stalled: the receiving side asks for 1 MiB (and carries on when it cannot)."""
    read, write = os.pipe()
    try:
        with os.fdopen(read, "rb") as stream:
            hostcache._widen(stream)
            assert fcntl.fcntl(stream.fileno(), fcntl.F_GETPIPE_SZ) == hostcache.PIPE_BYTES
        hostcache._widen(io.BytesIO(b""))                # not a pipe: nothing to do
    finally:
        os.close(write)


def test_a_push_answer_says_how_much_room_the_cache_has(tmp_path, payload):
    """Before the cache exists (its workdir's figure), and when nothing is missing."""
    cache = tmp_path / "work" / "cache"
    files = manifest(payload, "train.py")

    def answer(agent, name: str) -> Pushed:
        return agent.ask(PushRequest(str(tmp_path / "work" / "runs" / name), str(cache)),
                         body=stage_tar(name, files))
    with hostpkg.LocalAgent() as agent:
        first = answer(agent, "r1")
        assert first.missing and first.disk_path == str(tmp_path / "work")
        assert close(first.disk_free, statvfs_free(tmp_path))
        push(tmp_path, payload, "r2")         # the cache holds everything now
        again = answer(agent, "r3")
    assert again.assembled and again.disk_path == str(cache)
    assert close(again.disk_free, statvfs_free(cache))


def statvfs_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def close(free: int, measured: int) -> bool:
    """The same filesystem's free bytes, give or take what other writers did meanwhile."""
    return abs(free - measured) < 64 << 20


def test_a_disk_that_fills_during_a_receipt_is_named_and_leaves_no_partial_file(tmp_path):
    """A real full disk (a 1 MiB tmpfs) under a 2 MiB file: the error names the host's disk
    and the directory, not errno 28; nothing half-written stays in the cache."""
    from tmpfs import tmpfs
    big = tmp_path / "payload"
    big.mkdir()
    (big / "train.py").write_bytes(os.urandom(2 << 20))
    with tmpfs(tmp_path / "disk", "1m") as disk:
        rundir = disk / "work" / "runs" / "r1"
        files = manifest(big, "train.py")
        cache = disk / "work" / "cache"
        with hostpkg.LocalAgent() as agent:
            answer = agent.ask(PushRequest(str(rundir), str(cache), "h3", "0"),
                               body=stage_tar("r1", files))
            assert answer.disk_free < 1 << 20
            # The files as a run sends them, on the same channel after the answer.
            with pytest.raises(StepFailed) as failed:
                agent.agent.ask(Request(ReceiveRequest(str(rundir), str(cache), "h3", "0")),
                                "receive", files=FileStream(big, files, set(answer.missing))
                                ).wait(60)
        assert "payload receive: no space left on h3's disk in " + str(cache) \
            in str(failed.value)
        assert os.listdir(cache / "files") == [] and os.listdir(cache / "tmp") == []
