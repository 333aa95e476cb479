"""Archives from hosts (deploy/host/archive.py): what a compromised host can put in one, and
that none of it reaches outside the destination, on this Python whose own tarfile filter it
gets through; the limits, checked before anything is written; tar headers tarfile would read
whole into memory; and hypothesis-made hostile archives."""
from __future__ import annotations

import io
import os
import stat
import sys
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hostile
from deploy.host import archive
from deploy.host.archive import MAX_META, Limits, Refused, pack, survey, unpack


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under `root` (links not followed): its type and, for files, content."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            st_ = path.lstat()
            found[str(path.relative_to(root))] = (
                stat.S_IFMT(st_.st_mode),
                path.read_bytes() if stat.S_ISREG(st_.st_mode) else b"")
    return found


def only_plain(dest: Path) -> None:
    """Nothing under `dest` but directories and files private to their owner."""
    for top, dirs, files in os.walk(dest):
        for name in dirs + files:
            mode = (Path(top) / name).lstat().st_mode
            assert stat.S_ISDIR(mode) or stat.S_ISREG(mode), (top, name, oct(mode))
            assert stat.S_IMODE(mode) & 0o7077 == 0, (top, name, oct(mode))


@pytest.fixture
def sandbox(tmp_path):
    """(dest, victim): where an archive is unpacked, and a directory beside it holding a file
    an attacker wants to overwrite."""
    dest = tmp_path / "runs" / "r1" / "artifacts"
    dest.parent.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "flag").write_text("original")
    return dest, victim


def test_the_symlink_chain_gets_through_tarfiles_filter_here_and_not_through_ours(sandbox):
    """CVE-2025-4517: tarfile's data filter, on this Python, writes through the chain; the
    unpacking here writes nothing outside the destination and makes no link."""
    dest, victim = sandbox
    data = hostile.hostile_tar_gz(str(dest), "../../../victim")
    tarfile_dest = dest.parent / "by-tarfile"
    tarfile_dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(hostile.hostile_tar_gz(str(tarfile_dest),
                                                                  "../../../victim"))) as tar:
        for member in tar.getmembers():
            try:
                tar.extract(member, tarfile_dest, filter="data")
            except (tarfile.TarError, OSError):
                pass
    escaped = (victim / "flag").read_text() != "original"
    if sys.version_info < (3, 11, 13):
        assert escaped, "the chain should get through this Python's own filter"
    for name in ("flag", "newfile"):
        (victim / name).unlink(missing_ok=True)
    (victim / "flag").write_text("original")
    before = tree(victim)

    done = unpack(io.BytesIO(data), str(dest), Limits())
    assert tree(victim) == before
    only_plain(dest)
    skipped = dict(done.skipped)
    assert skipped["escape"] == "a symbolic link" and skipped["a"] == "a symbolic link"
    assert done.skipped_count >= 20
    # Files named through a skipped link land in a directory of that name, inside.
    assert (dest / "escape" / "newfile").read_bytes() == hostile.WRITTEN


def test_names_out_links_devices_fifos_and_setuid_bits_are_not_made(sandbox):
    dest, victim = sandbox
    before = tree(victim)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        hostile.plain_escapes(tar, "../../../victim")
        hostile.add(tar, "kept/model.bin", data=b"weights", mode=0o755)
    done = unpack(io.BytesIO(buf.getvalue()), str(dest), Limits())
    assert tree(victim) == before
    only_plain(dest)
    why = dict(done.skipped)
    assert why["null"] == "a character device" and why["disk"] == "a block device"
    assert why["pipe"] == "a fifo" and why["passwd"] == "a hard link"
    assert why["uplink"] == "a symbolic link"
    assert all(why[n] == "not a plain relative name" for n in why if ".." in n or
               n.startswith("/"))
    assert stat.S_IMODE((dest / "setuid").stat().st_mode) == 0o700
    assert stat.S_IMODE((dest / "kept" / "model.bin").stat().st_mode) == 0o700
    assert (dest / "kept" / "model.bin").read_bytes() == b"weights"
    assert done.files == 3       # setuid, uplink/through (a directory here), kept/model.bin


def test_a_link_planted_in_the_destination_is_never_followed(sandbox):
    """Whoever put a link there (an earlier archive, a race): the walk refuses to go through
    it, and a file in its place is replaced, not written through."""
    dest, victim = sandbox
    dest.mkdir()
    (dest / "sub").symlink_to(victim)
    (dest / "flag").symlink_to(victim / "flag")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        hostile.add(tar, "sub/flag", data=b"through the link")
        hostile.add(tar, "flag", data=b"in its place")
    done = unpack(io.BytesIO(buf.getvalue()), str(dest), Limits())
    assert (victim / "flag").read_text() == "original"
    assert dict(done.skipped)["sub/flag"].startswith("its folder cannot be made")
    assert not (dest / "flag").is_symlink() and (dest / "flag").read_bytes() == b"in its place"


def test_a_gzip_bomb_is_refused_at_the_header_before_anything_is_written(tmp_path):
    bomb = hostile.gzip_bomb(64 << 20)
    assert len(bomb) < 100_000
    dest = tmp_path / "dest"
    with pytest.raises(Refused, match=r"would unpack to more than 16\.0 MiB \(the limit\)") as refused:
        unpack(io.BytesIO(bomb), str(dest), Limits(bytes=16 << 20))
    assert refused.value.over_limit and not dest.exists()


def test_too_many_members_and_too_little_room_are_refused(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(11):
            hostile.add(tar, f"f{i}", data=b"x" * 1000)
    with pytest.raises(Refused, match="more than 10 members"):
        survey(io.BytesIO(buf.getvalue()), Limits(members=10))

    class Full:
        f_bavail, f_frsize = 100, 4096
    monkeypatch.setattr(archive.os, "fstatvfs", lambda fd: Full())
    with pytest.raises(Refused, match=r"it unpacks to 10\.7 KiB and .* has 400\.0 KiB free") \
            as refused:
        unpack(io.BytesIO(buf.getvalue()), str(tmp_path / "dest"), Limits())
    assert not refused.value.over_limit
    assert os.listdir(tmp_path / "dest") == []


def header_archive(*infos: tuple[tarfile.TarInfo, bytes], format=tarfile.GNU_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=format) as tar:
        for info, data in infos:
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tar_headers_that_tarfile_reads_whole_are_bounded():
    long = tarfile.TarInfo("x" * (MAX_META + 10))       # a GNU long name past the bound
    with pytest.raises(Refused, match="name and attributes take more than 64.0 KiB"):
        survey(io.BytesIO(header_archive((long, b""))), Limits())
    pax = tarfile.TarInfo("f")
    pax.pax_headers = {"comment": "y" * (MAX_META + 10)}
    with pytest.raises(Refused, match="name and attributes"):
        survey(io.BytesIO(header_archive((pax, b""), format=tarfile.PAX_FORMAT)), Limits())
    sparse = tarfile.TarInfo("s")
    sparse.type = tarfile.GNUTYPE_SPARSE
    with pytest.raises(Refused, match="sparse"):
        survey(io.BytesIO(header_archive((sparse, b""))), Limits())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT,
                      pax_headers={"note": "global"}) as tar:
        hostile.add(tar, "f", data=b"1")
    with pytest.raises(Refused, match="global header"):
        survey(io.BytesIO(buf.getvalue()), Limits())


def test_what_is_not_a_tar_gz_is_refused_as_such(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "noise").write_bytes(os.urandom(100_000))
    cut = pack(str(tmp_path / "out"), Limits())[:50_000]
    for data in (b"", b"not gzip at all", cut):
        with pytest.raises(Refused, match="not a tar.gz archive"):
            unpack(io.BytesIO(data), str(tmp_path / "dest"), Limits())


def test_a_folder_packs_and_unpacks_to_the_same_files(tmp_path):
    source = tmp_path / "output"
    (source / "tensorboard" / "train").mkdir(parents=True)
    (source / "model.keras").write_bytes(os.urandom(5000))
    (source / "tensorboard" / "train" / "events").write_bytes(b"e" * 100)
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    os.utime(source / "model.keras", (1_700_000_000, 1_700_000_000))
    data = pack(str(source), Limits())
    done = unpack(io.BytesIO(data), str(tmp_path / "copy"), Limits())
    assert (done.files, done.skipped) == (3, [])
    assert tree(tmp_path / "copy") == tree(source)
    assert stat.S_IMODE((tmp_path / "copy" / "run.sh").stat().st_mode) == 0o700
    assert (tmp_path / "copy" / "model.keras").stat().st_mtime == 1_700_000_000
    assert pack(str(tmp_path / "missing"), Limits()) == b""
    with pytest.raises(Refused, match="more than the limit"):
        pack(str(source), Limits(bytes=1000))


def test_the_limits_travel_as_words():
    limits = Limits(bytes=123 << 20, members=77)
    assert Limits.of_words(limits.words()) == limits
    assert limits.archive_bytes > limits.bytes


# --- hypothesis: hostile archives -------------------------------------------------------------

NAMES = st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "victim", "flag", "x" * 300,
                                  "é", "a\\b"]), min_size=1, max_size=5).map("/".join)
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE,
                         tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE,
                         tarfile.CONTTYPE, b"Z"])
MEMBERS = st.lists(st.tuples(NAMES, KINDS, NAMES, st.binary(max_size=64),
                             st.integers(0, 0o7777)), max_size=12)


def hostile_archive(members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, link, data, mode in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, mode
            regular = kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
            info.size = len(data) if regular else 0
            tar.addfile(info, io.BytesIO(data) if regular else None)
    return buf.getvalue()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(MEMBERS)
def test_no_hostile_archive_writes_outside_or_makes_anything_but_private_files(tmp_path,
                                                                                members):
    case = tmp_path / os.urandom(6).hex()
    dest, victim = case / "runs" / "r1" / "dest", case / "victim"
    dest.parent.mkdir(parents=True)
    victim.mkdir()
    (victim / "flag").write_text("original")
    data = hostile_archive(members) + (
        hostile.hostile_tar_gz(str(dest), "../../../victim") if len(members) % 3 == 0 else b"")
    before = {p: tree(p) for p in (victim, case / "runs" / "r1") if p.exists()}
    try:
        unpack(io.BytesIO(data), str(dest), Limits(bytes=1 << 20, members=500))
    except Refused:
        pass
    assert tree(victim) == before[victim]
    assert {k: v for k, v in tree(case / "runs" / "r1").items()
            if not k.startswith("dest")} == before[case / "runs" / "r1"]
    if dest.exists():
        only_plain(dest)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_are_unpacked_or_refused(data):
    try:
        survey(io.BytesIO(data), Limits())
    except Refused:
        pass
