"""The controller's copy of the chief's backup, renewed from what changed (archive.pack_changed
on the host, cluster/keptbackup.py here): only new or changed files travel, the copy always
equals the host's backup as it was listed, and what does not add up leaves the copy as it
was. tests/integration/test_hostagent.py fetches such copies through a real agent."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from deploy.cluster import keptbackup
from deploy.host.archive import Limits, Refused, listed, pack_changed, unpack

LIMITS = Limits(1 << 30, 1000)


def backup_dir(root: Path) -> Path:
    """A backup as BackupAndRestore leaves it, and a large file that never changes."""
    folder = root / "backup"
    (folder / "chief").mkdir(parents=True)
    (folder / "chief" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (folder / "chief" / "ckpt-1.index").write_bytes(b"i" * 100)
    (folder / "vocabulary.bin").write_bytes(os.urandom(1 << 20))
    return folder


def renewed(kept: Path, folder: Path) -> int:
    """One fetch as keep_backup makes it: the bytes that travelled."""
    body, files = pack_changed(str(folder), keptbackup.known(kept), LIMITS)
    keptbackup.renew(kept, io.BytesIO(body) if body else None, files, LIMITS)
    return len(body)


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def copy_of(kept: Path, into: Path) -> dict[str, bytes]:
    with kept.open("rb") as archive:
        unpack(archive, str(into), LIMITS)
    return contents(into)


def test_only_what_changed_travels_and_the_copy_equals_the_backup(tmp_path):
    folder, kept = backup_dir(tmp_path), tmp_path / "kept" / "chief.tar.gz"
    kept.parent.mkdir()
    first = renewed(kept, folder)
    assert first > 1 << 20                              # everything, the first time
    assert renewed(kept, folder) == 0                   # nothing changed: nothing travels
    # An epoch later: a new checkpoint, the old one gone, the large file untouched.
    (folder / "chief" / "ckpt-1.index").unlink()
    (folder / "chief" / "ckpt-2.index").write_bytes(b"j" * 100)
    (folder / "chief" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    later = renewed(kept, folder)
    assert 0 < later < 4096, later
    assert copy_of(kept, tmp_path / "copy") == contents(folder)
    with kept.open("rb") as archive:
        files, count = listed(archive)
    assert count == len(files) == 3 and all(ns is not None for _, ns in files.values())


def test_a_file_rewritten_with_the_same_size_travels_again(tmp_path):
    folder, kept = backup_dir(tmp_path), tmp_path / "chief.tar.gz"
    renewed(kept, folder)
    checkpoint = folder / "chief" / "checkpoint"
    stat = checkpoint.stat()
    checkpoint.write_text('model_checkpoint_path: "ckpt-9"\n')      # same length
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert 0 < renewed(kept, folder) < 4096
    assert copy_of(kept, tmp_path / "copy")["chief/checkpoint"] == checkpoint.read_bytes()


def packed(files: dict[str, bytes], mtime_ns: int = 5) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), {"TFDEPLOY.mtime_ns": str(mtime_ns)}
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("body, files, words", [
    # A file it sends but lists otherwise (or not at all).
    ({"a": b"xy"}, {"a": (3, 5)}, "which its list does not name as sent"),
    ({"a": b"xy", "b": b"z"}, {"a": (2, 5)}, "'b', which its list does not name"),
    # A file it lists but neither sends nor is in the copy as listed.
    ({}, {"a": (2, 5), "old": (1, 7)}, "2 file(s) it did not send are not in the copy"),
    # More than the limits, counted over the whole backup, not only what came.
    ({}, {f"f{i}": (1, 5) for i in range(1001)}, "more than the limit"),
    ({}, {"huge": (2 << 30, 5)}, "more than the limit"),
])
def test_what_does_not_add_up_is_refused_and_the_copy_stays(tmp_path, body, files, words):
    kept = tmp_path / "chief.tar.gz"
    kept.write_bytes(packed({"old": b"o"}))
    before = kept.read_bytes()
    data = packed(body) if body else None
    with pytest.raises(Refused, match=words.replace("(", r"\(").replace(")", r"\)")):
        keptbackup.renew(kept, io.BytesIO(data) if data else None, files, LIMITS)
    assert kept.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["chief.tar.gz"]      # no temporary left


def test_a_copy_that_cannot_be_read_makes_every_file_travel(tmp_path):
    folder, kept = backup_dir(tmp_path), tmp_path / "chief.tar.gz"
    kept.write_bytes(b"not a tar.gz")
    assert keptbackup.known(kept) == {}
    assert renewed(kept, folder) > 1 << 20
    assert copy_of(kept, tmp_path / "copy") == contents(folder)


def test_links_and_fifos_in_the_backup_are_not_sent(tmp_path):
    folder = backup_dir(tmp_path)
    (folder / "escape").symlink_to("/etc/passwd")
    os.mkfifo(folder / "pipe")
    body, files = pack_changed(str(folder), {}, LIMITS)
    assert sorted(files) == ["chief/checkpoint", "chief/ckpt-1.index", "vocabulary.bin"]
    assert pack_changed(str(tmp_path / "none"), {}, LIMITS) == (b"", None)
