"""The host pieces of shared workdirs, privacy and pruning, without a network: the filesystem
marker, run-directory membership and the last host's cleanup, unsafe workdirs, the verified
cache signature, the host's prune, the public-address warning and the README's note."""
from __future__ import annotations

import io
import json
import multiprocessing
import os
import pwd
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

import hostile
import hostpkg
from deploy.host.protocol import PushRequest
from deploy.host import cache as hostcache
from deploy.host import prune as hostprune
from deploy.host import rundir as rundir_module
from deploy.host import share, teardown
from deploy.host.probe import unsafe_workdir
from deploy.host.envkey import env_name
from deploy.inventory.load import parse_inventory
from deploy.plan.command import Request
from deploy.plan.retention import Keep, prune_request
from deploy.cluster.hostagent import StepFailed
from deploy.plan.lints import lint, public_warnings
from deploy.push.bundle import FileStream, manifest, manifest_document, stage_tar
from deploy.cluster.session import backup_targets, filesystem_groups, sharing

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


def test_host_prune_keeps_a_run_whose_task_still_runs_here_until_it_ends(tmp_path):
    """This host's own task, its exit not recorded: kept while its process group holds a
    process of the run (found by the run id in its environment), pruned once it is gone."""
    work = tmp_path / "work"
    rundir = run_dir(tmp_path, "20260101-000000-prunelive")
    share.join(str(rundir), "h1", [0])
    task = subprocess.Popen(["sleep", "60"], start_new_session=True,
                            env=dict(os.environ, TFDEPLOY_RUN_ID=rundir.name))
    try:
        (rundir / "worker-0.pid").write_text(json.dumps({"pid": task.pid, "pgid": task.pid}))
        assert hostprune.maybe_live(str(rundir), rundir.name, "h1")
        hostprune.prune(str(work), "h1", {}, 0, dry=False)
        assert rundir.is_dir(), "its task still runs here"
    finally:
        task.kill()
        task.wait()
    assert not hostprune.maybe_live(str(rundir), rundir.name, "h1")
    freed = hostprune.prune(str(work), "h1", {}, 0, dry=False)
    assert freed["runs"]["count"] == 1 and not rundir.exists()


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


# Hosts sharing a workdir at the same moment: several agents (processes, as hosts are) on one
# workdir, asked at once, round after round. A race is caught by repetition.

SHARING_HOSTS = 6


@pytest.fixture(scope="module")
def agents():
    started = []
    try:
        for i in range(SHARING_HOSTS):
            started.append(hostpkg.LocalAgent(hostpkg.local_host(name=f"h{i + 1}")))
        yield started
    finally:
        for agent in started:
            agent.close()


def many_files(root: Path, count: int, tag: str) -> Path:
    (root / "files").mkdir(parents=True)
    (root / "train.py").write_text(f"print({tag!r})\n")
    for i in range(count):
        (root / "files" / f"f{i:03d}.txt").write_text(f"{tag} file {i}\n")
    return root


def push_at_once(agents, rundir: Path, cache: Path, stage: bytes) -> list[dict]:
    """The stage and `push` to every agent before any answer is awaited, as Session.push asks."""
    replies = [agent.agent.ask(Request(PushRequest(str(rundir), str(cache), f"h{i + 1}", str(i))),
                               "push", stage) for i, agent in enumerate(agents)]
    return [reply.wait(60).document() for reply in replies]


def test_hosts_sharing_a_workdir_unpack_one_stage_with_its_riders_at_once(agents, tmp_path):
    """The first push of a payload: every file rides along with the manifest, every host
    unpacks the same stage into the same run directory and caches the same riders at the same
    moment. Each answers the payload assembled; the run directory holds the layout's names
    only (no rider, no temporary file), the cache every content once."""
    payload = many_files(tmp_path / "payload", 200, "a")
    files = manifest(payload, "train.py")
    cache = tmp_path / "work" / "cache"
    for round_ in range(5):
        run_id = f"r{round_}"
        rundir = tmp_path / "work" / "runs" / run_id
        answers = push_at_once(agents, rundir, cache, stage_tar(run_id, files, files, payload))
        assert all(a["assembled"] and a["missing"] == [] for a in answers), answers
        assert len({a["filesystem"] for a in answers}) == 1
        assert sorted(os.listdir(rundir)) == ["hosts", "manifest.json", "payload", "run.json"]
        assert (rundir / "payload" / "files" / "f199.txt").read_text() == "a file 199\n"
        assert len(os.listdir(rundir / "payload" / "files")) == 200
        assert sorted(os.listdir(rundir / "hosts")) == sorted(
            f"h{i + 1}.json" for i in range(SHARING_HOSTS))
    assert sorted(os.listdir(cache / "files")) == sorted({f.sha256 for f in files})
    assert os.listdir(cache / "tmp") == []
    for f in files:
        assert hostcache.usable(str(cache), f.sha256)


def test_hosts_sharing_a_workdir_store_one_content_at_once_and_the_first_stays(agents, tmp_path):
    """New content for every host at once, as riders of a changed payload: the file of the
    first host to link it stays (its inode), the signature recorded is that file's."""
    cache = tmp_path / "work" / "cache"
    for round_ in range(5):
        payload = many_files(tmp_path / f"p{round_}", 30, f"round {round_}")
        files = manifest(payload, "train.py")
        rundir = tmp_path / "work" / "runs" / f"r{round_}"
        answers = push_at_once(agents, rundir, cache, stage_tar(rundir.name, files, files,
                                                                payload))
        # Each content was taken into the cache by at least one host.
        taken = set().union(*(a["received"] for a in answers))
        assert taken == {f.sha256 for f in files}
        for f in files:
            path = cache / "files" / f.sha256
            signature = (cache / "verified" / f.sha256).read_text()
            assert signature == hostcache.signature(path.stat())
            assert (rundir / "payload" / f.path).stat().st_ino == path.stat().st_ino
    assert os.listdir(cache / "tmp") == []


def corrupted(tmp_path):
    """A cached file whose content became wrong (same size): cache, digest, path, the right
    content."""
    _, files, cache = cached_run(tmp_path)
    digest = files[0].sha256
    path = cache / "files" / digest
    right = path.read_bytes()
    path.chmod(0o600)
    path.write_bytes(b"x" * len(right))
    return cache, digest, path, right


def test_a_wrong_cache_file_found_by_two_hosts_never_costs_the_right_one(tmp_path):
    """Two hosts hash the same wrong file; the first drops it and stores the right content;
    the second's drop, late, must leave the right file in place."""
    cache, digest, path, right = corrupted(tmp_path)
    wrong = os.stat(path)                               # as the second host saw it
    assert not hostcache.usable(str(cache), digest)     # the first host drops it...
    assert not path.exists()
    hostcache._store(str(cache), digest, io.BytesIO(right), len(right))   # ...and stores it
    hostcache._drop(str(cache), digest, wrong)          # the second host, late
    assert path.read_bytes() == right and hostcache.usable(str(cache), digest)
    assert os.listdir(cache / "tmp") == []


def test_a_store_over_a_wrong_file_replaces_it(tmp_path):
    cache, digest, path, right = corrupted(tmp_path)
    (cache / "verified" / digest).unlink()
    hostcache._store(str(cache), digest, io.BytesIO(right), len(right))
    assert path.read_bytes() == right and hostcache.usable(str(cache), digest)


def write_many(path: str, text: str, times: int) -> None:
    for _ in range(times):
        rundir_module.write_atomic(path, text)


def test_two_writers_of_one_path_never_rename_each_others_temporary_file(tmp_path):
    """Two controllers saving payload-hashes.json at once (one runs directory), or any two
    writers of one name: each reader sees one writer's whole file, and no temporary is left."""
    path = str(tmp_path / "payload-hashes.json")
    texts = [json.dumps({"writer": w, "pad": "x" * 100_000}) for w in range(2)]
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=write_many, args=(path, text, 200)) for text in texts]
    for w in writers:
        w.start()
    seen = set()
    while any(w.is_alive() for w in writers):
        try:
            seen.add(json.loads(Path(path).read_text())["writer"])
        except FileNotFoundError:
            pass
    for w in writers:
        w.join()
        assert w.exitcode == 0
    assert seen <= {0, 1} and os.listdir(tmp_path) == ["payload-hashes.json"]


def hold_lock(cache: str, exclusive: bool, held, release) -> None:
    with hostcache.pruning_lock(cache, exclusive):
        held.set()
        release.wait(30)


def test_a_prune_waits_for_a_push_counting_on_the_cache(tmp_path):
    """A push holds the pruning lock shared while it decides which cached files it uses; a
    prune deletes only once it holds it alone, and then sees that push's manifest."""
    payload, files, cache = cached_run(tmp_path)
    work = tmp_path / "work"
    shutil.rmtree(work / "runs" / "r1")                 # the cached file is needed by no run
    ctx = multiprocessing.get_context("fork")
    held, release = ctx.Event(), ctx.Event()
    push = ctx.Process(target=hold_lock, args=(str(cache), False, held, release))
    push.start()
    try:
        assert held.wait(10)
        rundir = run_dir(tmp_path, "r2")                # the push's run, counting on the file
        (rundir / "manifest.json").write_text(json.dumps(manifest_document(files)))
        done = []
        pruning = threading.Thread(target=lambda: done.append(
            hostprune.prune(str(work), "h1", {}, 0, dry=False)))
        pruning.start()
        time.sleep(0.5)
        assert not done, "the prune waited"
        share.join(str(rundir), "h1", [0])              # its task is about to start
        release.set()
        pruning.join(10)
    finally:
        release.set()
        push.join()
    assert done and done[0]["files"]["count"] == 0
    assert (cache / "files" / files[0].sha256).exists()


def test_prune_counts_the_bytes_it_frees_not_the_names(tmp_path):
    """A run directory's payload is hard links into the cache: deleting the run frees its own
    files only, unless the cached files go too; then each content counts once."""
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_bytes(b"w" * 10_000)
    files = manifest(payload, "train.py")
    cache = tmp_path / "work" / "cache"
    rundir = run_dir(tmp_path, "r1")
    (rundir / "manifest.json").write_text(json.dumps(manifest_document(files)))
    wanted = hostcache.want(str(rundir), str(cache))
    hostcache.receive(str(rundir), str(cache), io.BytesIO(b"".join(
        FileStream(payload, files, set(wanted["missing"])))))
    own = sum(p.stat().st_size for p in rundir.rglob("*") if p.is_file() and
              "payload" not in p.parts)
    kept = hostprune.prune(str(tmp_path / "work"), "h1", {"files": [files[0].sha256]}, 0,
                           dry=True)
    assert kept["runs"] == {"count": 1, "bytes": own} and kept["files"]["count"] == 0
    freed = hostprune.prune(str(tmp_path / "work"), "h1", {}, 0, dry=True)
    assert freed["runs"] == {"count": 1, "bytes": own}
    assert freed["files"] == {"count": 1, "bytes": 10_000}
    assert freed == hostprune.prune(str(tmp_path / "work"), "h1", {}, 0, dry=False)


def test_one_backup_per_filesystem_and_none_to_the_chiefs():
    filesystems = {"h1": "A", "h2": "A", "h3": "B", "h4": "B", "h5": None, "h6": "C"}
    assert backup_targets("h1", list(filesystems), filesystems) == ["h3", "h5", "h6"]
    assert backup_targets("h4", list(filesystems), filesystems) == ["h1", "h5", "h6"]
    assert backup_targets("h1", ["h1", "h2"], {}) == ["h2"]     # filesystems not told


def test_data_is_sent_once_per_filesystem_and_tree():
    trees = {"h1": "t1", "h2": "t1", "h3": "t2", "h4": "t2", "h5": "t1"}
    filesystems = {"h1": "A", "h2": "A", "h3": "A", "h4": "A", "h5": "B"}
    assert sharing(filesystem_groups(filesystems, trees.get)) == {"h2": "h1", "h4": "h3"}
    assert sharing(filesystem_groups(filesystems)) == {"h2": "h1", "h3": "h1", "h4": "h1"}
    assert sharing(filesystem_groups({"h1": None, "h2": None})) == {}


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
