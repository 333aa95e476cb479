"""The inventory's `data:` field end to end without a network: parsing, the tree hash that names
a local data directory on the hosts, TFDEPLOY_DATA_DIR in the plan and the run record, the
host side (deploy/host/datatree.py asked of a host's agent as a run asks it: data-push, then
data-receive; the data dir kept by content; the push through a local host), the remote path's
check, and the agent refusing a data dir that is not there."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

import hostpkg
from counting import CountingTransport
from test_payload_push import CountingAgent
from deploy.host import probe as hostcheck
from deploy.host.protocol import DataPushRequest, DataReceiveRequest, LaunchRequest, Probe
from deploy.inventory.datasource import DataSource, host_data_dir
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import InventoryError
from deploy.plan.checks import HostCheck, judge_probe, probe_request
from deploy.plan.command import HostPath, Request
from deploy.plan.planner import Options, plan_run
from deploy.plan.text import plan_document, plan_text
from deploy.push import hashcache
from deploy.push.data import DataPush, DataTree
from deploy.push.hashcache import HashCache
from deploy.cluster.hostagent import StepFailed
from deploy.cluster.session import Session
from deploy.state.record import RunRecord, RunState, load_record, write_record

RUN_ID = "20260101-000000-abcdef"


def shards(root: Path) -> dict[str, Path]:
    """Two shard directories with different files, and a third equal to the first."""
    dirs = {}
    for name, files in {"a": {"part-0.bin": b"A" * 1000, "sub/part-1.bin": b"a1"},
                        "b": {"part-0.bin": b"B" * 3000},
                        "a-again": {"part-0.bin": b"A" * 1000, "sub/part-1.bin": b"a1"}}.items():
        for rel, content in files.items():
            path = root / name / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        dirs[name] = root / name
    return dirs


def inventory(tmp_path: Path, body: str):
    path = tmp_path / "lab.yaml"
    path.write_text(body)
    return parse_inventory(body, str(path), environ={})


LAB = """
defaults:
  data: {remote: ~/datasets//mnist/}
hosts:
  - name: a
    address: 10.0.0.1
    data: {local: shards/a}
  - name: b
    address: 10.0.0.2
    workers: 2
    data: {local: ./shards/b}
  - name: c
    address: 10.0.0.3
  - name: d
    address: 10.0.0.4
    data: {local: shards/a}
"""


@pytest.fixture
def lab(tmp_path):
    shards(tmp_path / "shards")
    return inventory(tmp_path, LAB)


def test_both_forms_parse_relative_to_the_inventory_and_defaults_apply(lab, tmp_path):
    a, b, c, d = lab.hosts
    assert a.data == DataSource("local", str(tmp_path / "shards" / "a"), given="shards/a")
    assert b.data.path == str(tmp_path / "shards" / "b") and b.data.given == "./shards/b"
    assert c.data == DataSource("remote", "~/datasets/mnist", given="~/datasets//mnist/")
    assert d.data == a.data
    assert all(h.data.tree is None for h in lab.hosts)


def test_a_host_without_data_has_no_data_dir(tmp_path):
    inv = inventory(tmp_path, "hosts:\n  - name: a\n    address: h\n")
    assert inv.hosts[0].data is None
    (task,) = plan_run(inv, Options(), RUN_ID).tasks
    assert "TFDEPLOY_DATA_DIR" not in task.env
    assert "data" not in plan_document(plan_run(inv, Options(), RUN_ID))["hosts"][0]


def test_the_tree_hash_names_content_and_paths_not_where_the_dir_is(tmp_path):
    dirs = shards(tmp_path)
    hashes = HashCache()
    a, again, b = (DataTree.of(dirs[n], hashes) for n in ("a", "a-again", "b"))
    assert a.sha256 == again.sha256 != b.sha256
    assert [f.path for f in a.files] == ["part-0.bin", "sub/part-1.bin"] and a.size == 1002
    (dirs["a-again"] / "sub" / "part-1.bin").rename(dirs["a-again"] / "sub" / "part-2.bin")
    assert DataTree.of(dirs["a-again"], hashes).sha256 != a.sha256


def test_unchanged_data_is_not_read_again(tmp_path, monkeypatch):
    dirs = shards(tmp_path)
    # As if the files had settled (the hash cache remembers files unchanged for 3 s).
    monkeypatch.setattr(hashcache, "SETTLE_NS", 0)
    memory = tmp_path / "data-hashes.json"
    first = HashCache(memory)
    DataTree.of(dirs["b"], first)
    first.save()
    second = HashCache(memory)
    monkeypatch.setattr(hashcache, "file_sha256", lambda path: pytest.fail(f"read {path}"))
    tree = DataTree.of(dirs["b"], second)
    assert second.changed == set() and len(tree.files) == 1


def test_a_symlink_out_of_a_data_dir_is_refused_naming_host_and_field(tmp_path, lab):
    (tmp_path / "secret.txt").write_text("x")
    (tmp_path / "shards" / "b" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(InventoryError) as caught:
        DataPush(lab)
    error = caught.value
    assert (error.host, error.field) == ("b", "data")
    assert str(error).startswith(f"{lab.path}: host 'b': field 'data': local: ")
    assert "symlink points outside the data directory" in str(error)


def test_the_plan_gives_each_task_its_hosts_data_dir(lab):
    data = DataPush(lab)
    assert len(data.trees) == 2                       # a and d share one directory
    resolved = data.resolved(lab)
    plan = plan_run(resolved, Options(), RUN_ID)
    trees = {h.name: h.data.tree for h in resolved.hosts}
    dirs = {t.index: t.env["TFDEPLOY_DATA_DIR"].value for t in plan.tasks}
    assert dirs == {0: f"~/.tfdeploy/data/{trees['a']}", 1: f"~/.tfdeploy/data/{trees['b']}",
                    2: f"~/.tfdeploy/data/{trees['b']}", 3: "~/datasets/mnist",
                    4: f"~/.tfdeploy/data/{trees['a']}"}
    a, b, c, d = plan.hosts
    # A request to the host's agent, with the stage: it unpacks it and answers what it lacks.
    assert a.data_push.shown().startswith(
        f"agent: data-push rundir=~/.tfdeploy/runs/{RUN_ID} "
        f"data_dir=~/.tfdeploy/data/{trees['a']} cache_dir=~/.tfdeploy/cache    < ")
    assert a.data_push.wire() == {
        "verb": "data-push", "home": ["rundir", "data_dir", "cache_dir"], "fields": {
            "rundir": f"~/.tfdeploy/runs/{RUN_ID}", "data_dir": f"~/.tfdeploy/data/{trees['a']}",
            "cache_dir": "~/.tfdeploy/cache"}}
    assert c.data_push is None and c.data_dir == "~/datasets/mnist"
    text = plan_text(plan)
    assert f"  data:   local shards/a -> ~/.tfdeploy/data/{trees['a']}; kept between runs" in text
    assert "  data:   remote ~/datasets//mnist/ (already on the host; checked, not pushed)" in text
    assert "<tree-sha256>" not in text
    assert plan_document(plan)["hosts"][2]["data"] == {"source": "remote ~/datasets//mnist/",
                                                       "dir": "~/datasets/mnist"}


def test_the_dry_run_shows_where_the_data_will_be_before_hashing(lab):
    text = plan_text(plan_run(lab, Options(), RUN_ID))
    assert "env TFDEPLOY_DATA_DIR=~/.tfdeploy/data/<tree-sha256>" in text
    assert "content hash of its files, computed at push" in text
    assert host_data_dir("/w", None) is None


def test_the_record_replans_the_same_data_dirs(lab, tmp_path):
    plan = plan_run(DataPush(lab).resolved(lab), Options(), RUN_ID,
                    {i: 20000 + i for i in range(5)})
    run_dir = tmp_path / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord.of(plan, RunState.DETACHED, 1.0))
    again = load_record(run_dir).plan()
    assert [hp.host for hp in again.hosts] == [hp.host for hp in plan.hosts]
    assert [hp.data_dir for hp in again.hosts] == [hp.data_dir for hp in plan.hosts]
    for mine, theirs in zip(again.tasks, plan.tasks):
        assert mine.env["TFDEPLOY_DATA_DIR"] == theirs.env["TFDEPLOY_DATA_DIR"]
        assert mine.launch == theirs.launch


def test_a_record_from_before_data_replans_without_it(lab, tmp_path):
    plan = plan_run(DataPush(lab).resolved(lab), Options(), RUN_ID, {i: 20000 + i for i in range(5)})
    doc = json.loads(json.dumps(RunRecord.of(plan, RunState.DETACHED, 1.0).document()))
    for host in doc["hosts"]:
        del host["data"]
    old = RunRecord.from_document(doc, "old record")
    assert all("TFDEPLOY_DATA_DIR" not in t.env for t in old.plan().tasks)


# -- the host side, as a host runs it ----------------------------------------------------------

def host_run_dir(tmp_path: Path, name: str) -> Path:
    rundir = tmp_path / "work" / "runs" / name
    rundir.mkdir(parents=True)
    return rundir


@pytest.fixture(scope="module")
def agent():
    """A host's agent, started as the controller starts one."""
    with hostpkg.LocalAgent() as started:
        yield started


def data_request(verb: str, rundir: Path, datadir: str) -> Request:
    kind = DataPushRequest if verb == "data-push" else DataReceiveRequest
    return Request(kind(str(rundir), datadir, str(rundir.parents[1] / "cache")))


def want(agent, tree: DataTree, rundir: Path, datadir: str | None = None) -> dict:
    """The data-push request: the stage unpacked into the run dir, and what the cache lacks
    (the room left where it would go is checked, then left out), as the push keeps it."""
    datadir = datadir or str(rundir.parents[1] / "data" / tree.sha256)
    answer = agent.agent.ask(data_request("data-push", rundir, datadir), "data-push",
                             tree.stage()).wait(60).document()
    assert answer.pop("disk_free") > 0 and answer.pop("disk_path")
    assert answer.pop("filesystem")          # hosts that share it are sent the tree once
    return answer


def receive(agent, rundir: Path, datadir: str, stream: bytes) -> dict:
    return agent.agent.ask(data_request("data-receive", rundir, datadir), "data-receive",
                           files=[stream]).wait(60).document()


def push(agent, data: DataPush, tree: DataTree, rundir: Path) -> tuple[dict, dict | None]:
    """data-push, then data-receive if needed, as DataPush.send drives each host."""
    wanted = want(agent, tree, rundir)
    if wanted["present"] or wanted.get("assembled"):
        return wanted, None
    stream = b"".join(data.content(tree, frozenset(wanted["missing"])))
    return wanted, receive(agent, rundir, str(rundir.parents[1] / "data" / tree.sha256), stream)


def test_data_is_sent_once_kept_by_content_and_found_again(agent, tmp_path, lab):
    data = DataPush(lab)
    tree = data.trees[lab.hosts[0].data.path]
    want, got = push(agent, data, tree, host_run_dir(tmp_path, "r1"))
    assert want["present"] is False and len(want["missing"]) == 2
    assert sorted(got["received"]) == want["missing"] and got["bytes"] == 1002
    datadir = tmp_path / "work" / "data" / tree.sha256
    assert (datadir / "part-0.bin").read_bytes() == b"A" * 1000
    assert (datadir / "sub" / "part-1.bin").read_bytes() == b"a1"
    assert not os.access(datadir / "part-0.bin", os.W_OK) or os.geteuid() == 0
    inode = datadir.stat().st_ino
    # Teardown of the run directory leaves the data: it lives outside every run.
    shutil.rmtree(tmp_path / "work" / "runs" / "r1")
    want, got = push(agent, data, tree, host_run_dir(tmp_path, "r2"))
    assert want == {"present": True, "missing": [], "received": [], "files": 2} and got is None
    assert datadir.stat().st_ino == inode
    # Gone data dir, full cache: assembled again at once, nothing sent.
    shutil.rmtree(datadir)
    want, got = push(agent, data, tree, host_run_dir(tmp_path, "r3"))
    assert want["assembled"] and want["missing"] == [] and got is None
    assert (datadir / "part-0.bin").read_bytes() == b"A" * 1000
    assert not [p for p in (tmp_path / "work" / "runs" / "r3").iterdir()
                if p.name.startswith(".data-")]


def test_the_push_is_two_requests_per_host_and_a_second_sends_nothing(tmp_path):
    """DataPush.send on a local host, through its agent: the stage and the answer of what the
    cache lacks, then those files; a second push of the same data is one round trip."""
    dirs = shards(tmp_path / "shards")
    inv = inventory(tmp_path, f"hosts:\n  - {{name: h, transport: local, workdir: "
                              f"'{tmp_path / 'work'}', data: {{local: shards/a}}}}\n")
    transport = CountingTransport(inv.hosts[0])
    agent = CountingAgent(inv.hosts[0], transport)
    session = Session({"h": transport}, {"h": agent})
    quiet = Console(file=open(os.devnull, "w"))

    def send(run_id: str) -> dict:
        data = DataPush(inv)
        plan = plan_run(data.resolved(inv), Options(), run_id)
        agent.asked.clear()
        return data.send(session, plan, quiet.status, lambda line: None)["hosts"]["h"]

    try:
        first = send("r1")
        assert agent.asked == ["data-push", "data-receive"]
        assert first["present"] is False and len(first["received"]) == 2
        assert first["bytes"] == 1002
        assert (Path(first["dir"]) / "sub" / "part-1.bin").read_bytes() == b"a1"
        second = send("r2")
        assert agent.asked == ["data-push"]
    finally:
        session.close()
    assert transport.commands == 0          # no command beside the agent's own channel
    assert second["present"] is True and second["received"] == [] and second["bytes"] == 0
    assert second["dir"] == first["dir"] and dirs["a"].exists()


def test_a_data_dir_not_named_by_its_manifest_is_refused(agent, tmp_path, lab):
    data = DataPush(lab)
    tree = data.trees[lab.hosts[0].data.path]
    rundir = host_run_dir(tmp_path, "r1")
    push(agent, data, tree, rundir)
    with pytest.raises(StepFailed, match="not named by its manifest's hash"):
        want(agent, tree, rundir, str(tmp_path / "work" / "data" / ("0" * 64)))


def test_a_cut_stream_leaves_no_data_dir(tmp_path, lab):
    """The channel ends in the middle of the files (a dropped connection)."""
    data = DataPush(lab)
    tree = data.trees[lab.hosts[1].data.path]
    rundir = host_run_dir(tmp_path, "r1")
    datadir = str(rundir.parents[1] / "data" / tree.sha256)
    with hostpkg.LocalAgent() as agent:
        wanted = want(agent, tree, rundir)
        stream = b"".join(data.content(tree, frozenset(wanted["missing"])))
        reply = agent.agent.ask(data_request("data-receive", rundir, datadir), "data-receive",
                                files=[stream[:len(stream) // 2]])
        agent.agent.stream.proc.stdin.close()
        with pytest.raises(StepFailed, match="cut short"):
            reply.wait(60)
    assert not Path(datadir).exists()
    assert not [p for p in rundir.iterdir() if p.name.startswith(".data-")]


def test_the_summary_counts_each_directorys_new_files_once(lab):
    data = DataPush(lab)
    plan = plan_run(data.resolved(lab), Options(), RUN_ID)
    plans = [hp for hp in plan.hosts if hp.data_push]
    a_files = [f.sha256 for f in data.trees[lab.hosts[0].data.path].files]
    answers = {"a": {"missing": a_files, "received": []}, "b": {"missing": [], "received": []},
               "d": {"missing": a_files[:1], "received": []}}
    assert data.summary(plans, answers) == "data: 2 of 3 file(s) new (1002 B) → 2 of 3 host(s)"


# -- remote data: checked before anything starts; the agent refuses a missing one -----------------

def test_the_probe_asks_about_a_remote_data_path_and_names_host_and_field(lab, tmp_path):
    a, b, c, d = lab.hosts
    asked = probe_request(c)
    data_dir = asked.message.data_dir
    assert data_dir == "~/datasets/mnist" and isinstance(data_dir, HostPath)
    assert asked.shown().endswith(" ports=5 data_dir=~/datasets/mnist")
    assert probe_request(a).message.data_dir is None               # local data: nothing to ask
    assert hostcheck.data_problem(str(tmp_path / "nowhere")) == "does not exist"
    assert hostcheck.data_problem(str(tmp_path / "lab.yaml")) == "is not a directory"
    assert hostcheck.data_problem(str(tmp_path)) is None
    check = HostCheck(c)
    judge_probe(check, Probe.decode({
        "python": "3", "executable": "python3", "versions": {}, "disk_path": "/",
        "disk_free": 1 << 40, "writable": True, "ports": [], "ipv6": True,
        "externally_managed": False, "data_problem": "does not exist"}, "probe"))
    assert check.problems == ["c (10.0.0.3): field 'data': remote path ~/datasets/mnist does "
                              "not exist on the host"]


def test_the_agent_refuses_to_start_a_task_without_its_data_dir(agent, tmp_path):
    rundir = tmp_path / "run"
    rundir.mkdir()
    (rundir / "run.json").write_text(json.dumps({"run_id": RUN_ID}))
    with pytest.raises(StepFailed, match=r"is not a directory on this host \(field 'data'"):
        agent.ask(LaunchRequest(str(rundir), "0", str(tmp_path), (sys.executable, "-c", "pass")),
                  TFDEPLOY_RUN_ID=RUN_ID, TFDEPLOY_DATA_DIR=str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists() and not (rundir / "worker-0.pid").exists()


def test_two_trees_pushed_into_one_run_directory_keep_their_own_manifests(agent, tmp_path, lab):
    """Hosts sharing a workdir (so one run directory) with a shard each: each tree's manifest
    is named by the tree, and neither push reads the other's."""
    data = DataPush(lab)
    a, b = (data.trees[lab.hosts[i].data.path] for i in (0, 1))
    rundir = host_run_dir(tmp_path, "r1")
    wanted = {tree.sha256: want(agent, tree, rundir) for tree in (a, b)}
    for tree in (a, b):
        stream = b"".join(data.content(tree, frozenset(wanted[tree.sha256]["missing"])))
        receive(agent, rundir, str(tmp_path / "work" / "data" / tree.sha256), stream)
    assert sorted(p.name for p in rundir.glob("data-*.json")) == sorted(
        f"data-{t.sha256}.json" for t in (a, b))
    data_dirs = tmp_path / "work" / "data"
    assert (data_dirs / a.sha256 / "sub" / "part-1.bin").read_bytes() == b"a1"
    assert (data_dirs / b.sha256 / "part-0.bin").read_bytes() == b"B" * 3000
