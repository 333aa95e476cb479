"""The host pieces of shared workdirs, privacy and pruning, without a network: the filesystem
marker, run-directory membership and the last host's cleanup, unsafe workdirs, the verified
cache signature, the host's prune, the public-address warning and the README's note."""
from __future__ import annotations

import io
import json
import os
import pwd
import shutil
from pathlib import Path

import pytest

import hostile
import hostpkg
from deploy.host import cache as hostcache
from deploy.host import prune as hostprune
from deploy.host import share, teardown
from deploy.host.check import unsafe_workdir
from deploy.host.envkey import env_name
from deploy.inventory.load import parse_inventory
from deploy.plan.prune import Keep, prune_request
from deploy.ssh.agent import StepFailed
from deploy.plan.lints import lint, public_warnings
from deploy.push.bundle import FileStream, manifest, manifest_document

REPO = Path(__file__).resolve().parents[2]
DAY = 86400


def test_hosts_reading_one_workdir_get_one_filesystem_id(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    first, second = share.filesystem_id(str(work)), share.filesystem_id(str(work))
    assert first and first == second
    other = tmp_path / "other"
    other.mkdir()
    assert share.filesystem_id(str(other)) not in (None, first)
    # A copy of the workdir (another inode) carries the marker but is not the same filesystem.
    copy = tmp_path / "copy"
    shutil.copytree(work, copy)
    assert share.filesystem_id(str(copy)) is None


def run_dir(tmp_path, run_id="r1"):
    path = tmp_path / "work" / "runs" / run_id
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"run_id": run_id}))
    return path


def test_the_run_directory_goes_with_the_last_host_that_used_it(tmp_path):
    rundir = run_dir(tmp_path)
    share.join(str(rundir), "h1", [0])
    share.join(str(rundir), "h2", [1])
    assert share.member_tasks(str(rundir), "h2") == [1]
    first = teardown.cleanup(str(rundir), 0.1, "h1")
    assert "removed" not in first and rundir.is_dir()
    assert (rundir / "run.json").exists()
    last = teardown.cleanup(str(rundir), 0.1, "h2")
    assert last["removed"] == str(rundir.resolve()) and not rundir.exists()


def test_a_run_directory_no_host_joined_is_deleted_by_its_cleanup(tmp_path):
    rundir = run_dir(tmp_path)
    assert "removed" in teardown.cleanup(str(rundir), 0.1, "h1")
    assert not rundir.exists()


def test_unsafe_workdirs_are_named_with_owner_and_mode(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert unsafe_workdir(str(mine)) is None
    assert unsafe_workdir(str(mine / "not" / "yet")) is None        # created under a safe dir
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    assert "mode 0777" in unsafe_workdir(str(open_dir / "work"))    # would be created there
    open_dir.chmod(0o1777)                                          # sticky, like /tmp
    assert unsafe_workdir(str(open_dir / "work")) is None
    if os.getuid() == 0:
        nobody = pwd.getpwnam("nobody")
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, nobody.pw_uid, nobody.pw_gid)
        problem = unsafe_workdir(str(foreign))
        assert problem.startswith(f"unsafe workdir {foreign}: owned by nobody, mode 0700")


def cached_run(tmp_path):
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text("print('hi')\n")
    files = manifest(payload, "train.py")
    cache = tmp_path / "work" / "cache"
    rundir = run_dir(tmp_path, "r1")
    (rundir / "manifest.json").write_text(json.dumps(manifest_document(files)))
    wanted = hostcache.want(str(rundir), str(cache))
    data = b"".join(FileStream(payload, files, set(wanted["missing"])))
    hostcache.receive(str(rundir), str(cache), io.BytesIO(data))
    return payload, files, cache


def test_a_changed_cache_file_is_hashed_again_and_never_linked(tmp_path):
    payload, files, cache = cached_run(tmp_path)
    digest = files[0].sha256
    path = cache / "files" / digest
    assert hostcache.usable(str(cache), digest)
    path.chmod(0o600)
    path.write_text("print('HI')\n")                   # same size, other content
    assert not hostcache.usable(str(cache), digest)
    assert not path.exists()
    rundir = run_dir(tmp_path, "r2")
    (rundir / "manifest.json").write_text(json.dumps(manifest_document(files)))
    assert hostcache.want(str(rundir), str(cache))["missing"] == [digest]


def test_an_unchanged_cache_file_without_signature_is_verified_once(tmp_path):
    _, files, cache = cached_run(tmp_path)
    digest = files[0].sha256
    (cache / "verified" / digest).unlink()
    assert hostcache.usable(str(cache), digest)
    assert (cache / "verified" / digest).exists()


def snapshot(root: Path) -> dict[str, int]:
    return {str(p): p.lstat().st_size for p in root.rglob("*")}


def test_host_prune_frees_unneeded_files_and_old_runs_only(tmp_path):
    _, files, cache = cached_run(tmp_path)
    work = tmp_path / "work"
    old = work / "cache" / "files" / ("ab" * 32)
    old.write_bytes(b"x" * 1000)
    (work / "cache" / "files" / "not-a-hash").write_bytes(b"y" * 10)
    (work / "envs" / ("0" * 16)).mkdir(parents=True)
    (work / "envs" / "mine").mkdir()
    live = run_dir(tmp_path, "live")
    share.join(str(live), "h2", [1])                   # h2's task 1 has no exit file
    (live / "worker-1.pid").write_text(json.dumps({"pid": 1, "pgid": 999999999}))
    before = snapshot(work)
    keep = {"files": [], "runs": [], "envs": []}
    dry = hostprune.prune(str(work), "h1", keep, 0, dry=True)
    assert snapshot(work) == before
    freed = hostprune.prune(str(work), "h1", keep, 0, dry=False)
    assert freed == dry
    assert freed["files"]["count"] == 2 and freed["files"]["bytes"] >= 1000   # r1's and old
    assert freed["runs"]["count"] == 1 and freed["envs"]["count"] == 1
    assert not old.exists() and not (work / "runs" / "r1").exists()
    assert live.is_dir(), "a task of another host may still run"
    assert (work / "cache" / "files" / "not-a-hash").exists() and (work / "envs" / "mine").exists()


def test_host_prune_keeps_young_runs_and_what_they_need(tmp_path):
    _, files, cache = cached_run(tmp_path)
    work = tmp_path / "work"
    freed = hostprune.prune(str(work), "h1", {}, DAY, dry=False)
    assert freed["runs"]["count"] == freed["files"]["count"] == 0
    assert (cache / "files" / files[0].sha256).exists()


def test_host_prune_keeps_every_hosts_env_of_kept_requirements(tmp_path):
    """Hosts sharing the workdir may each have an environment of one requirements.txt (their
    Python builds differ): all of them stay while those requirements are kept, whichever host
    prunes; the environments of other requirements go."""
    work = tmp_path / "work"
    kept, other = "1a" * 32, "2b" * 32
    names = {(r, key): env_name(r, key) for r in (kept, other) for key in ("0" * 16, "f" * 16)}
    for name in names.values():
        (work / "envs" / name / "bin").mkdir(parents=True)
    freed = hostprune.prune(str(work), "h1", {"requirements": [kept]}, DAY, dry=False)
    assert freed["envs"]["count"] == 2
    assert sorted(os.listdir(work / "envs")) == sorted(
        name for (r, _), name in names.items() if r == kept)


def test_host_prune_is_asked_of_the_agent_and_refuses_an_unsafe_workdir(tmp_path):
    _, files, cache = cached_run(tmp_path)
    work = tmp_path / "work"
    host = hostpkg.local_host(str(work))
    keep = Keep().document()
    with hostpkg.LocalAgent(host) as agent:
        dry = agent.agent.ask(prune_request(host, 0, dry_run=True), "prune", keep).wait(30)
        assert dry.files.count == 1 and (cache / "files" / files[0].sha256).exists()
        work.chmod(0o777)
        with pytest.raises(StepFailed, match="prune failed: unsafe workdir"):
            agent.agent.ask(prune_request(host, 0, dry_run=False), "prune", keep).wait(30)
    assert (cache / "files" / files[0].sha256).exists()


def inventory(text):
    return parse_inventory(text, "lab.yaml", environ={})


def test_a_public_cluster_address_is_warned_about_not_refused():
    inv = inventory("hosts:\n  - {name: a, address: 8.8.8.8}\n"
                    "  - {name: b, address: 10.1.2.4}\n")
    (warning,) = public_warnings(inv)
    assert "host 'a'" in warning and "8.8.8.8" in warning and "unauthenticated" in warning
    assert lint(inv, REPO / "payload") == []
    private = inventory("hosts:\n  - {name: a, address: 192.168.1.2}\n"
                        "  - {name: b, address: gpu-b.lab}\n")
    assert public_warnings(private) == []


def test_the_readme_says_grpc_ports_are_unauthenticated():
    text = (REPO / "README.md").read_text()
    assert "gRPC ports accept unauthenticated requests" in text


@pytest.mark.parametrize("value, seconds", [("90", 90), ("90s", 90), ("30m", 1800),
                                            ("12h", 43200), ("7d", 604800)])
def test_prune_ages_take_units(value, seconds):
    import tasks
    assert tasks.duration("--older-than", value) == seconds


def test_a_bad_prune_age_is_bad_input():
    import tasks
    from deploy.errors import BadInput
    with pytest.raises(BadInput, match="--older-than"):
        tasks.duration("--older-than", "soon")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give files to nobody")
def test_every_component_of_a_workdir_is_checked_links_included(tmp_path):
    """lstat, component by component, and again where links lead: another user's link in a
    sticky directory open to all (/tmp), or another user's directory on the way, or one that
    group or others may write, lets that user point the tool's writes anywhere."""
    nobody = pwd.getpwnam("nobody")
    link, target = hostile.foreign_link(tmp_path)
    problem = unsafe_workdir(str(link / "sub"))
    assert problem.startswith(f"unsafe workdir {link}/sub: {link} is a symbolic link owned by "
                              "nobody; ")
    os.lchown(link, 0, 0)                 # the user's own link: where it leads is judged
    assert unsafe_workdir(str(link)) is None
    os.chown(target, nobody.pw_uid, nobody.pw_gid)
    assert f"unsafe workdir {link}: owned by nobody, mode 0700" in unsafe_workdir(str(link))
    theirs = tmp_path / "theirs"
    (theirs / "mine").mkdir(parents=True)
    os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
    assert f"in {theirs}, owned by nobody" in unsafe_workdir(str(theirs / "mine"))
    group = tmp_path / "group"
    (group / "mine").mkdir(parents=True)
    group.chmod(0o770)
    assert f"in {group}, owned by root, mode 0770" in unsafe_workdir(str(group / "mine" / "w"))
