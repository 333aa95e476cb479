"""What travels to every host: the stage (identity, agent, manifest) and the files by hash."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from deploy.push import bundle
from deploy.push.bundle import BundleError, FileStream, manifest, payload_files, stage_tar

RUN_ID = "20260101-000000-b0b0b0"


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def read(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(name).read()


def build_bundle(payload: Path, entry: str, run_id: str) -> dict[str, object]:
    """The payload as it arrives: relative path -> manifest entry."""
    stage_tar(run_id, files := manifest(payload, entry))
    return {f"payload/{f.path}": f for f in files}


@pytest.fixture
def payload(tmp_path):
    root = tmp_path / "payload"
    for d in ("pkg/__pycache__", "pkg/deep/er", ".git/objects", "nb/.ipynb_checkpoints"):
        (root / d).mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "deep" / "er" / "data file.csv").write_text("a,b\n1,2\n")
    (root / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (root / "pkg" / "stray.pyc").write_bytes(b"\0")
    (root / ".git" / "objects" / "ab").write_bytes(b"git")
    (root / "nb" / "a.ipynb").write_text("{}")
    (root / "nb" / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text("{}")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_stage_holds_identity_and_manifest(payload):
    files = manifest(payload, "train.py")
    stage = stage_tar(RUN_ID, files)
    assert stage[:2] == b"\x1f\x8b"                        # gzip
    assert sorted(members(stage)) == ["manifest.json", "run.json"]
    assert json.loads(read(stage, "run.json")) == {"run_id": RUN_ID}
    doc = json.loads(read(stage, "manifest.json"))
    assert [row[0] for row in doc["files"]] == ["nb/a.ipynb", "pkg/__init__.py",
                                                "pkg/deep/er/data file.csv", "pkg/util.py",
                                                "run.sh", "train.py"]
    by_path = {row[0]: row for row in doc["files"]}
    assert by_path["pkg/deep/er/data file.csv"][1:] == [
        hashlib.sha256(b"a,b\n1,2\n").hexdigest(), 0o644, 8]
    assert by_path["run.sh"][2] == 0o755                   # the executable bit travels


def test_the_file_stream_holds_each_wanted_content_once_headed_by_its_hash(payload):
    (payload / "copy.py").write_text("X = 1\n")            # same content as pkg/util.py
    files = manifest(payload, "train.py")
    util = next(f for f in files if f.path == "pkg/util.py")
    train = next(f for f in files if f.path == "train.py")
    data = b"".join(FileStream(payload, files, {util.sha256, train.sha256}))
    # In manifest order (copy.py brings util.py's content first), each content once.
    assert data == (b"tfdeploy-files 1\n" + f"{util.sha256} {util.size}\n".encode()
                    + b"X = 1\n" + f"{train.sha256} {train.size}\n".encode()
                    + b"print('hi')\n" + b"end\n")
    assert b"".join(FileStream(payload, files, set())) == b"tfdeploy-files 1\nend\n"
    with pytest.raises(BundleError, match="not in the payload"):
        b"".join(FileStream(payload, files, {"0" * 64}))


def test_hosts_iterating_one_stream_share_reads_and_only_what_the_slowest_still_needs(
        tmp_path, monkeypatch):
    root = tmp_path / "shard"
    root.mkdir()
    for i in range(4):
        (root / f"part-{i}.bin").write_bytes(bytes([i]) * 1000)
    files = manifest(root, "part-0.bin")
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: reads.append(p.name) or real(p))
    stream = FileStream(root, files, {f.sha256 for f in files})
    expected = b"".join(FileStream(root, files, {f.sha256 for f in files}))
    reads.clear()
    fast, slow = iter(stream), iter(stream)
    got_fast = [next(fast), next(slow)]
    got_slow = [got_fast.pop()]
    got_fast += [next(fast) for _ in range(6)]          # three files ahead of the slow host
    assert stream._kept_bytes == 3000                    # what the slow host has yet to read
    got_slow += list(slow)
    assert stream._kept_bytes == 2000           # files 2 and 3: the fast host is on file 2
    got_fast += list(fast)
    assert b"".join(got_fast) == b"".join(got_slow) == expected
    assert sorted(reads) == [f"part-{i}.bin" for i in range(4)]    # each read once
    assert stream._kept_bytes == 0                       # nothing kept once both are done
    # Past SHARED_BYTES a host behind reads the file itself: same bytes, bounded memory.
    monkeypatch.setattr(bundle, "SHARED_BYTES", 1500)
    stream = FileStream(root, files, {f.sha256 for f in files})
    reads.clear()
    fast, slow = iter(stream), iter(stream)
    next(slow)
    assert b"".join(fast) == expected and stream._kept_bytes <= 1500
    assert b"".join([b"tfdeploy-files 1\n", *slow]) == expected
    assert len(reads) == 4 + 3                           # three files read again for it


def test_skipped_parts_never_reach_the_bundle(payload):
    names = [p.as_posix() for p in payload_files(payload)]
    assert not any("__pycache__" in n or n.endswith(".pyc") or ".git" in n.split("/")
                   or ".ipynb_checkpoints" in n for n in names)


def test_a_symlink_inside_the_payload_is_fine_when_relative(payload):
    (payload / "link.py").symlink_to("pkg/util.py")
    assert "payload/link.py" in build_bundle(payload, "train.py", RUN_ID)


@pytest.mark.parametrize("target", ["/etc", "/etc/hostname", "../../outside.txt", "/nonexistent"])
def test_a_symlink_out_of_the_payload_is_refused(payload, target):
    (payload.parent / "outside.txt").write_text("secret")
    link = payload / "pkg" / "escape"
    link.symlink_to(target)
    with pytest.raises(BundleError, match="symlink points outside the payload") as caught:
        build_bundle(payload, "train.py", RUN_ID)
    assert str(link) in str(caught.value)


def test_missing_entry_script_and_payload_are_errors(payload, tmp_path):
    with pytest.raises(BundleError, match=r"entry script 'main\.py' not found in payload"):
        build_bundle(payload, "main.py", RUN_ID)
    with pytest.raises(BundleError, match=r"entry script 'pkg' not found"):
        build_bundle(payload, "pkg", RUN_ID)                   # a directory is not a script
    with pytest.raises(BundleError, match="payload directory .* does not exist"):
        build_bundle(tmp_path / "missing", "train.py", RUN_ID)
    (tmp_path / "file").write_text("")
    with pytest.raises(BundleError, match="does not exist"):
        build_bundle(tmp_path / "file", "train.py", RUN_ID)


def test_an_entry_in_a_subdirectory_is_found(payload):
    bundle = build_bundle(payload, "pkg/util.py", RUN_ID)
    assert "payload/pkg/util.py" in bundle


@pytest.mark.parametrize("outside", ["../elsewhere.py", "ABSOLUTE"])
def test_an_entry_outside_the_payload_is_refused(payload, outside):
    script = payload.parent / "elsewhere.py"
    script.write_text("print('not shipped')\n")
    entry = str(script) if outside == "ABSOLUTE" else outside
    with pytest.raises(BundleError):
        build_bundle(payload, entry, RUN_ID)


def test_an_absolute_symlink_inside_the_payload_arrives_usable(payload):
    (payload / "alias.py").symlink_to(payload / "pkg" / "util.py")
    entry = build_bundle(payload, "train.py", RUN_ID)["payload/alias.py"]
    assert entry.size == len("X = 1\n")                    # its content, not a link


def test_a_symlinked_directory_inside_the_payload_is_shipped(payload):
    (payload / "lib").symlink_to("pkg")
    found = build_bundle(payload, "train.py", RUN_ID)
    assert "payload/lib" in found or "payload/lib/util.py" in found
