"""`inv check`'s pure parts (what to ask, how to judge the answers, the mesh, the table) and
the host side (deploy/host/probe.py), run as a host runs it: asked of the host's agent, which
runs from memory (nothing written), or by another interpreter with its source on stdin."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hostpkg
from deploy.host.probe import LINE_WAIT, distributions_along, version_of
from deploy.host.envkey import env_python
from deploy.host.protocol import (
    Connect, MeshDialed, MeshListenRequest, MeshListening, MeshResult, PortsRequest, Probe,
    ProbeRequest, decode_request
)
from deploy.inventory.load import parse_inventory
from deploy.plan.checks import (
    HOSTCHECK_SOURCE, MIN_DISK_FREE, PUSH_MARGIN_BYTES, CheckReport, HostCheck,
    assign_task_ports, judge_mesh, judge_probe, mesh_pairs, mesh_requests, mesh_specs,
    probe_request, push_needs, room_problem, rows, version_problems
)
from deploy.plan.lints import lint
from deploy.plan.planner import Options, plan_run
from deploy.plan.ports import choose_ports, task_ports
from deploy.run.hostchecks import probe_asker, run_checks
from deploy.run.mesh import probe_mesh
from deploy.cluster.hostagent import HostAgent
from deploy.cluster.session import Session
from deploy.transport.local import LocalTransport

THREE = ("hosts:\n  - {name: a, address: 10.1.2.3}\n"
         "  - {name: b, address: 10.1.2.4, workers: 2}\n"
         "  - {name: c, address: ssh-c, cluster_address: 10.1.2.5}\n")
GOOD = {"tensorflow": "2.21.0", "tf_keras": "2.21.0", "numpy": "2.4.6"}


def inventory(text=THREE):
    return parse_inventory(text, "lab.yaml", environ={})


def probe(versions=GOOD, free=10 * 1024 ** 3, ports=(20001, 20002, 20003, 20004, 20005),
          writable=True, **more):
    return Probe.decode({"python": "3.11.2", "executable": "python3",
                         "versions": dict(versions), "disk_path": "/srv", "disk_free": free,
                         "writable": writable, "ports": list(ports), "ipv6": True,
                         "externally_managed": False, **more},
                        "probe")


def probed(text=THREE, answers=None):
    checks = [HostCheck(h) for h in inventory(text).hosts]
    for c in checks:
        judge_probe(c, (answers or {}).get(c.host.name) or probe())
    return checks


@pytest.fixture(scope="module")
def agent():
    """One host's agent, started as the controller starts it, for the module's host checks."""
    with hostpkg.LocalAgent() as started:
        yield started


def test_probe_and_mesh_requests_are_shown_quoted_and_carry_their_words_literally():
    host = inventory("hosts:\n  - {name: a, address: x, python: /opt/py3,"
                     " workdir: '~/my dir'}\n").hosts[0]
    probe_it = probe_request(host)
    assert probe_it.shown() == "agent: probe workdir=~/'my dir' ports=5"
    assert probe_it.wire() == {"verb": "probe", "fields": {"workdir": "~/my dir", "ports": 5},
                               "home": ["workdir"]}
    spec = {"host": "a", "nonce": "n", "window": 1.0, "attempt": 0.5, "listen": {"2": 1},
            "targets": (("x", 1, "$(id)"),)}
    listen, dial, close = mesh_requests(spec)
    assert listen.shown().startswith("agent: mesh-listen host=a nonce=n window=1.0 ")
    assert "$(id)" in listen.shown() and listen.wire()["home"] == []
    assert decode_request(json.loads(json.dumps(listen.wire()))) == listen.message
    assert (dial.shown(), close.shown()) == ("agent: mesh-dial", "agent: mesh-close")
    # With `inv setup`'s environment, named by its requirements (the host computes which one
    # is its own), the probe's source comes with the request for that interpreter to run.
    probe_env = probe_request(host, "e" * 64)
    assert probe_env.wire()["fields"]["requirements"] == "e" * 64
    assert probe_env.wire()["home"] == ["workdir"]
    assert probe_env.body


@pytest.mark.parametrize("env_exists", [True, False])
def test_the_probe_runs_the_setup_environment_where_it_exists(agent, tmp_path, env_exists):
    """The tasks run `inv setup`'s interpreter when it exists, so that one is probed: this
    host's, named on the host (envkey.py), not another one's of the same requirements in a
    shared workdir."""
    requirements = "d" * 64
    workdir = tmp_path / "work dir"
    for key in ["f" * 16] + ([None] if env_exists else []):
        path = Path(env_python(str(workdir), requirements, key=key))
        path.parent.mkdir(parents=True)
        path.symlink_to(sys.executable)
    env = env_python(str(workdir), requirements)
    host = inventory(f"hosts:\n  - {{name: a, address: x, workdir: '{workdir}',"
                     f" python: '{sys.executable}'}}\n").hosts[0]
    answer = agent.agent.ask(probe_request(host, requirements), "probe",
                             HOSTCHECK_SOURCE.read_bytes()).wait(60)
    assert answer.executable == (str(env) if env_exists else sys.executable)


def test_a_healthy_probe_has_no_problems():
    assert all(c.problems == [] for c in probed())


@pytest.mark.parametrize("answer, words", [
    (probe(versions={**GOOD, "tensorflow": None}),
     "a (10.1.2.3): tensorflow is not installed for python3 (pip install tensorflow)"),
    (probe(versions={**GOOD, "tf_keras": None}), "tf_keras is not installed for python3 "
                                                 "(pip install tf-keras)"),
    (probe(versions={**GOOD, "tf_keras": "2.20.1"}),
     "a (10.1.2.3): tf_keras 2.20.1 does not match tensorflow 2.21.0 "
     "(pip install 'tf-keras~=2.21.0')"),
    (probe(free=MIN_DISK_FREE - 1), "a (10.1.2.3): only 512.0 MiB free under /srv"),
    (probe(writable=False), "cannot create the workdir ~/.tfdeploy: /srv is not writable"),
])
def test_probe_problems_name_the_host_and_the_fix(answer, words):
    (problem,) = probed(answers={"a": answer})[0].problems
    assert words in problem


def test_versions_differing_between_hosts_are_one_cluster_problem():
    checks = probed(answers={"c": probe(versions={**GOOD, "tensorflow": "2.20.0",
                                                  "tf_keras": "2.20.0"})})
    assert version_problems(checks) == [
        "tensorflow differs between hosts: 2.20.0 on c; 2.21.0 on a, b — install one version "
        "everywhere",
        "tf_keras differs between hosts: 2.20.0 on c; 2.21.0 on a, b — install one version "
        "everywhere"]
    assert version_problems(probed()) == []


def test_ports_are_distinct_across_the_cluster_as_a_run_chooses_them():
    checks = probed()       # every host reports the same free ports (one machine, a lab)
    assert assign_task_ports(checks) is None
    assert [c.ports for c in checks] == [[20001], [20002, 20003], [20004]]
    short = probed(answers={"c": probe(ports=(20001, 20002))})
    assert assign_task_ports(short) == "c (ssh-c): could not find 1 free ports"


def test_a_run_takes_the_ports_the_mesh_check_reached():
    checks = probed()
    assign_task_ports(checks)
    plan = plan_run(inventory(), Options(), "20260101-000000-abcdef")
    ports = task_ports(plan.tasks, CheckReport(checks).host_ports)
    assert ports == {0: 20001, 1: 20002, 2: 20003, 3: 20004}
    endpoints = [t.endpoint for t in plan_run(inventory(), Options(), "r", ports).tasks]
    assert endpoints == ["10.1.2.3:20001", "10.1.2.4:20002", "10.1.2.4:20003", "10.1.2.5:20004"]


def test_choose_ports_keeps_inventory_order():
    hosts = inventory().hosts
    assert choose_ports([(hosts[0], 1), (hosts[1], 2)], {"a": [5, 6], "b": [5, 7, 8]}) == {
        "a": [5], "b": [7, 8]}


def test_mesh_pairs_every_host_dials_every_other_task_and_its_own_siblings():
    checks = probed()
    assign_task_ports(checks)
    pairs = {(s.host.name, d.host.name, p) for s, d, p in mesh_pairs(checks)}
    assert pairs == {("a", "b", 20002), ("a", "b", 20003), ("a", "c", 20004),
                     ("b", "a", 20001), ("b", "b", 20002), ("b", "b", 20003), ("b", "c", 20004),
                     ("c", "a", 20001), ("c", "b", 20002), ("c", "b", 20003)}
    specs = mesh_specs(checks, "n0nce")
    assert specs["b"]["listen"] == {"20002": 3, "20003": 3}     # from a, c and b itself
    assert specs["a"]["targets"] == [("10.1.2.4", 20002, "b"), ("10.1.2.4", 20003, "b"),
                                     ("10.1.2.5", 20004, "c")]


def answers_for(specs, failing=()):
    """Mesh answers as the hosts would give them; `failing` maps (from, port) -> error."""
    failing = dict(failing)
    return {name: {"connects": [
        {"address": a, "port": p, "host": h, **({"error": failing[(name, p)]}
                                                  if (name, p) in failing else {"ok": True})}
        for a, p, h in spec["targets"]], "accepted": {}, "bind_errors": {}}
        for name, spec in specs.items()}


def decoded(answers):
    return {name: MeshResult.decode(answer, "mesh-close") for name, answer in answers.items()}


def test_mesh_problems_land_on_the_host_that_was_not_reached():
    checks = probed()
    assign_task_ports(checks)
    answers = answers_for(mesh_specs(checks, "n"), {("a", 20002): "timeout",
                                                    ("c", 20002): "refused"})
    answers["b"]["bind_errors"] = {"20003": "Address already in use"}
    judge_mesh(checks, decoded(answers), {})
    a, b, c = checks
    assert a.problems == [] and c.problems == []
    assert b.problems == [
        "b (10.1.2.4): port 20002 not reachable from a (no answer within 5 s) — firewall?",
        "b (10.1.2.4): cannot listen on port 20003: Address already in use — taken by another "
        "program?",
        "b (10.1.2.4): port 20002 refused a connection from c: nothing listens there — is "
        "10.1.2.4 really b's address (cluster_address)?"]
    assert (b.mesh_in, b.mesh_out) == ((4, 6), (4, 4))
    assert (a.mesh_in, a.mesh_out) == ((2, 2), (2, 3))


def test_mesh_reaching_the_wrong_host_or_a_stranger_is_said_so():
    checks = probed()
    assign_task_ports(checks)
    answers = answers_for(mesh_specs(checks, "n"))
    answers["a"]["connects"][2].update(ok=False, error="wrong-host", detail="b")
    answers["b"]["connects"][0].update(ok=False, error="foreign")
    judge_mesh(checks, decoded(answers), {"c": "c (ssh-c): mesh check failed: timed out"})
    assert checks[2].problems == [
        "c (10.1.2.5): port 20004: a reached host b's listener instead — c and b have cluster "
        "addresses that lead to the same machine",
        "c (ssh-c): mesh check failed: timed out"]
    assert checks[0].problems == [
        "a (10.1.2.3): port 20001: b reached another program, not a — is 10.1.2.3 really a's "
        "address (cluster_address)?"]


def test_rows_one_per_host_with_versions_disk_ports_mesh_and_problems():
    checks = probed(answers={"b": probe(versions={**GOOD, "numpy": None})})
    assign_task_ports(checks)
    judge_mesh(checks, decoded(answers_for(mesh_specs(checks, "n"))), {})
    unreachable = HostCheck(inventory("hosts:\n  - {name: d, address: 10.9.9.9}\n").hosts[0],
                            problems=["d (10.9.9.9): no answer on port 22"])
    table = rows(CheckReport(checks + [unreachable]))
    assert table[0] == ["a", "10.1.2.3", "3.11.2", "2.21.0", "2.21.0", "2.4.6", "10.0 GiB",
                        "20001", "ok", "ok"]
    assert table[1][5] == "missing" and "numpy is not installed" in table[1][9]
    assert table[1][7] == "20002, 20003"
    assert table[2][1] == "ssh-c (cluster 10.1.2.5)"
    assert table[3] == ["d", "10.9.9.9", "-", "-", "-", "-", "-", "-", "-",
                        "d (10.9.9.9): no answer on port 22"]


# --- lints -----------------------------------------------------------------------------------

def test_duplicate_endpoint_two_machines_one_cluster_address_is_refused():
    inv = inventory("hosts:\n  - {name: a, address: 10.1.2.3}\n"
                    "  - {name: b, address: 10.1.2.4, cluster_address: 10.1.2.3}\n")
    (problem,) = lint(inv, HOSTCHECK_SOURCE.parent / "nowhere")
    assert "host 'b': cluster address '10.1.2.3' is also that of host 'a'" in problem
    assert "set cluster_address to the address of b itself" in problem


def test_one_machine_twice_or_an_all_loopback_lab_is_no_duplicate():
    same_machine = inventory("hosts:\n  - {name: a, address: 10.1.2.3}\n"
                             "  - {name: b, address: 10.1.2.3, user: other}\n")
    lab = inventory("hosts:\n  - {name: a, address: 127.0.0.2, cluster_address: 127.0.0.1}\n"
                    "  - {name: b, address: 127.0.0.3, cluster_address: 127.0.0.1}\n")
    nowhere = HOSTCHECK_SOURCE.parent / "nowhere"
    assert lint(same_machine, nowhere) == [] and lint(lab, nowhere) == []


# --- deploy/host/probe.py, run as a host runs it ---------------------------------------------

def hostcheck(*args: str, timeout: float = 30) -> dict:
    """The probe as another interpreter than the agent's runs it: its source on stdin."""
    done = subprocess.run([sys.executable, "-I", "-", *args], input=HOSTCHECK_SOURCE.read_bytes(),
                          capture_output=True, timeout=timeout, check=True)
    return json.loads(done.stdout)


def mesh(agent, spec: dict, timeout: float = 30) -> dict:
    """A mesh probe that is not driven: it dials at once and answers its listen request."""
    return agent.ask(MeshListenRequest(**spec), timeout=timeout)


@pytest.mark.parametrize("asked", ["agent", "stdin"])
def test_probe_reads_versions_without_importing_and_finds_the_nearest_existing_dir(
        agent, tmp_path, asked):
    workdir = str(tmp_path / "not" / "yet")
    answer = agent.ask(ProbeRequest(workdir, 3)) if asked == "agent" else Probe.decode(
        hostcheck(json.dumps({"workdir": workdir, "count": 3, "data": None})), "probe")
    assert answer.disk_path == str(tmp_path) and answer.disk_free > 0
    assert answer.writable is True and len(set(answer.ports)) == 3
    assert answer.python == sys.version.split()[0]
    from importlib import metadata
    assert answer.versions["numpy"] == metadata.version("numpy")
    assert not (tmp_path / "not").exists()


def test_ports_are_distinct_free_ports(agent):
    ports = agent.ask(PortsRequest(3)).ports
    assert len(ports) == 3 and len(set(ports)) == 3
    assert all(isinstance(p, int) and 0 < p < 65536 for p in ports)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mesh_answers_with_its_identity_and_stops_its_listeners(agent, tmp_path):
    mine, dead = free_port(), free_port()
    spec = {"host": "a", "nonce": "n0", "window": 2, "attempt": 1, "listen": {str(mine): 1},
            "targets": [["127.0.0.1", mine, "a"], ["127.0.0.1", dead, "b"]]}
    answer = mesh(agent, spec)
    assert answer.connects[0] == Connect("127.0.0.1", mine, "a", ok=True)
    assert answer.connects[1].error == "refused"
    assert answer.accepted == {str(mine): 1}
    with socket.socket() as s:          # the listener is gone with the answer
        assert s.connect_ex(("127.0.0.1", mine)) != 0


def test_mesh_says_when_a_port_belongs_to_another_host_listener(agent):
    port = free_port()
    spec = {"host": "b", "nonce": "n1", "window": 2, "attempt": 1, "listen": {str(port): 1},
            "targets": [["127.0.0.1", port, "a"]]}
    (result,) = mesh(agent, spec).connects
    assert result.error == "wrong-host" and result.detail == "b"


def test_mesh_names_a_stranger_a_silent_listener_and_a_refusal_apart(agent):
    """What a dial meets, each target on its own: a program answering something else is
    foreign at once; one that accepts and never answers is a timeout once the window is over
    (every try waits its line for LINE_WAIT); a closed port is refused."""
    stranger, silent = socket.socket(), socket.socket()
    stopping = threading.Event()

    def answer_junk():
        while not stopping.is_set():
            try:
                conn, _ = stranger.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
    try:
        for s in (stranger, silent):
            s.bind(("127.0.0.1", 0))
            s.listen(64)
        threading.Thread(target=answer_junk, daemon=True).start()
        targets = [["127.0.0.1", stranger.getsockname()[1], "a"],
                   ["127.0.0.1", silent.getsockname()[1], "b"],
                   ["127.0.0.1", free_port(), "c"]]
        spec = {"host": "z", "nonce": "n5", "window": 3, "attempt": 1, "listen": {},
                "targets": targets}
        started = time.monotonic()
        foreign, quiet, refused = mesh(agent, spec).connects
        assert foreign.error == "foreign" and "not a tfdeploy check listener" in foreign.detail
        assert quiet.error == "timeout" and refused.error == "refused"
        assert time.monotonic() - started < 3 + 2 * LINE_WAIT + 5
    finally:
        stopping.set()
        for s in (stranger, silent):
            s.close()


def test_a_mesh_listener_answers_many_callers_at_once(agent):
    """Three hundred dials to one port (more than DIALERS at a time, all in flight together
    with the listener's answers, in one process): each answered, each counted once."""
    port = free_port()
    spec = {"host": "a", "nonce": "n6", "window": 20, "attempt": 5, "listen": {str(port): 300},
            "targets": [["127.0.0.1", port, "a"]] * 300}
    answer = mesh(agent, spec, timeout=60)
    assert [c.ok for c in answer.connects] == [True] * 300
    assert answer.accepted == {str(port): 300}


def test_mesh_listeners_end_by_themselves_when_callers_never_come(agent):
    """A lost controller or a peer that never dials leaves nothing: the window bounds it."""
    port = free_port()
    spec = {"host": "a", "nonce": "n2", "window": 1, "attempt": 1, "listen": {str(port): 2},
            "targets": []}
    answer = mesh(agent, spec, timeout=15)    # ends by itself, or this fails
    assert answer == MeshResult(connects=(), accepted={str(port): 0}, bind_errors={})


def test_an_ipv6_cluster_address_on_a_host_without_ipv6_is_named():
    v6 = "hosts:\n  - {name: a, address: gpu-a.lab, cluster_address: 'fd00::3'}\n" \
         "  - {name: b, address: 10.1.2.4}\n"
    a, b = probed(v6, answers={"a": probe(ipv6=False), "b": probe(ipv6=False)})
    (problem,) = a.problems
    assert "a (gpu-a.lab): cluster address fd00::3 is IPv6, but the host has no IPv6" in problem
    assert b.problems == []           # an IPv4 cluster address needs no IPv6


def test_mesh_targets_are_bare_addresses_for_the_host_to_connect_to():
    checks = probed("hosts:\n  - {name: a, address: '[2001:db8::1]'}\n"
                    "  - {name: b, address: 2001:db8::2}\n")
    assign_task_ports(checks)
    specs = mesh_specs(checks, "n")
    assert [t[0] for t in specs["a"]["targets"]] == ["2001:db8::2"]
    assert [t[0] for t in specs["b"]["targets"]] == ["2001:db8::1"]


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback ::1")
def test_mesh_listeners_answer_callers_over_ipv6_and_ipv4_alike(agent):
    """As TensorFlow's gRPC binds [::]:port: one listener, reached at ::1 and at 127.0.0.1."""
    port = agent.ask(PortsRequest(1)).ports[0]
    spec = {"host": "a", "nonce": "n6", "window": 3, "attempt": 1, "listen": {str(port): 2},
            "targets": [["::1", port, "a"], ["127.0.0.1", port, "a"]]}
    answer = mesh(agent, spec)
    assert [c.ok for c in answer.connects] == [True, True], answer
    assert answer.accepted == {str(port): 2} and answer.bind_errors == {}
    assert agent.ask(ProbeRequest("/", 1)).ipv6 is True


def test_a_driven_mesh_probe_listens_until_told_to_dial_and_to_close(agent):
    """Phases as requests: listening is said first and lasts past the window until "close"."""
    mine, dead = free_port(), free_port()
    spec = {"host": "a", "nonce": "n3", "window": 0.5, "attempt": 1, "driven": 20,
            "listen": {str(mine): 1},
            "targets": [["127.0.0.1", mine, "a"], ["127.0.0.1", dead, "b"]]}
    listen, dial, close = mesh_requests(spec)
    try:
        assert agent.agent.ask(listen, "listen").wait(30) == MeshListening((mine,), {})
        time.sleep(1.5)                     # three windows: a host slow to start its probe
        assert agent.agent.ask(dial, "dial").wait(30) == MeshDialed(2)
        with socket.socket() as s:          # still listening after dialing, until "close"
            assert s.connect_ex(("127.0.0.1", mine)) == 0
    finally:
        answer = agent.agent.ask(close, "close").wait(30)
    assert answer.connects[0] == Connect("127.0.0.1", mine, "a", ok=True)
    assert answer.connects[1].error == "refused"
    assert answer.accepted == {str(mine): 1}
    with socket.socket() as s:              # closed: the listener is gone
        assert s.connect_ex(("127.0.0.1", mine)) != 0


class SlowToStart:
    """A local transport whose host starts its probe `delay` seconds late (a slow SSH login,
    a busy host): the mesh probe's first phase reaches it that much later."""

    def __init__(self, transport, delay):
        self.transport, self.delay = transport, delay

    def stream(self, line):
        return SlowStream(self.transport.stream(line), self.delay)

    def __getattr__(self, name):
        return getattr(self.transport, name)


class SlowStream:
    def __init__(self, stream, delay):
        self.stream, self.delay = stream, delay

    def send(self, data):
        if data.startswith(b'{"verb": "mesh-listen"'):
            time.sleep(self.delay)
        self.stream.send(data)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_no_host_dials_before_every_host_listens_however_late_one_starts(agent):
    hosts = parse_inventory(
        f"hosts:\n  - {{name: a, transport: local, python: '{sys.executable}'}}\n"
        f"  - {{name: b, transport: local, python: '{sys.executable}', workers: 2, workdir: /b}}\n",
        "lab.yaml", environ={}).hosts
    checks = [HostCheck(h) for h in hosts]
    ports = iter(agent.ask(PortsRequest(3)).ports)
    for c in checks:
        c.ports = [next(ports) for _ in range(c.host.workers)]
    specs = mesh_specs(checks, "n4")
    for spec in specs.values():
        spec["window"] = 0.5                # b starts its probe long after a's window
    transports = {"a": LocalTransport(hosts[0]), "b": SlowToStart(LocalTransport(hosts[1]), 2)}
    agents = {name: HostAgent(h, transports[name]) for name, h in zip("ab", hosts)}
    try:
        answers, errors = probe_mesh(checks, agents, specs)
    finally:
        Session(transports, agents).close()
    judge_mesh(checks, answers, errors)
    assert errors == {} and [c.problems for c in checks] == [[], []]
    assert [(c.mesh_in, c.mesh_out) for c in checks] == [((1, 1), (2, 2)), ((4, 4), (3, 3))]


def test_the_checks_run_through_a_session_of_agents(tmp_path):
    """`inv check` and `train`'s checks: the probe, the ports and the mesh asked of every
    host's agent in one session; a host with no agent is a row with its problem."""
    hosts = parse_inventory(
        f"hosts:\n  - {{name: a, transport: local, python: '{sys.executable}',"
        f" workdir: '{tmp_path}/a'}}\n"
        f"  - {{name: b, transport: local, python: '{sys.executable}', workers: 2,"
        f" workdir: '{tmp_path}/b'}}\n"
        f"  - {{name: c, transport: local, python: '{sys.executable}'}}\n",
        "lab.yaml", environ={})
    a, b, _ = hosts.hosts
    transports = {h.name: LocalTransport(h) for h in (a, b)}
    session = Session(transports, {h.name: HostAgent(h, transports[h.name]) for h in (a, b)})
    try:
        report = run_checks(hosts, session, {"c": "c: no answer on port 22"})
    finally:
        session.close()
    checked = {c.host.name: c for c in report.hosts}
    assert checked["c"].problems == ["c: no answer on port 22"]
    for name in "ab":
        assert checked[name].probe.python == sys.version.split()[0]
        assert checked[name].problems == [], checked[name].problems
    assert [(checked[n].mesh_in, checked[n].mesh_out) for n in "ab"] == [
        ((1, 1), (2, 2)), ((4, 4), (3, 3))]
    ports = checked["a"].ports + checked["b"].ports
    assert len(ports) == len(set(ports)) == 3


MiB = 1024 ** 2


def test_a_push_needs_its_bytes_and_a_margin():
    assert push_needs(0) == PUSH_MARGIN_BYTES
    assert push_needs(100 * MiB) == 110 * MiB + PUSH_MARGIN_BYTES
    assert room_problem("h3", 28 * MiB, "/srv", 60 * MiB) == (
        "h3: 28.0 MiB free in /srv, this push needs 60.0 MiB (130.0 MiB with the margin for "
        "logs and output)")
    assert room_problem("h3", push_needs(60 * MiB), "/srv", 60 * MiB) is None


@pytest.mark.parametrize("free, push, words", [
    (30 * MiB, 60 * 10 ** 6, "a (10.1.2.3): 30.0 MiB free in /srv, this push needs 57.2 MiB"),
    (600 * MiB, 700 * 10 ** 6, "a (10.1.2.3): 600.0 MiB free in /srv, this push needs "
                               "667.6 MiB"),
    # Room for the push, not for a run: the floor still speaks.
    (MIN_DISK_FREE - 1, MiB, "a (10.1.2.3): only 512.0 MiB free under /srv"),
])
def test_a_host_without_room_for_the_push_is_a_problem(free, push, words):
    checks = [HostCheck(h) for h in inventory().hosts]
    judge_probe(checks[0], probe(free=free), push)
    (problem,) = checks[0].problems
    assert words in problem


def test_a_host_with_room_for_the_push_has_no_problem():
    checks = [HostCheck(h) for h in inventory().hosts]
    judge_probe(checks[0], probe(free=2 * 1024 * MiB), 700 * 10 ** 6)
    assert checks[0].problems == []


def test_a_push_is_refused_before_any_file_when_a_host_lacks_room_for_what_it_lacks():
    """Only the contents a host's cache lacks count, and a host lacking nothing still needs the
    margin; a host sharing another's workdir is sent nothing; the room figures leave the
    answers (the push's record)."""
    from deploy.push.payload import NoRoom, refuse_without_room
    plans = plan_run(inventory(), Options(), "20260101-000000-abcdef", None).hosts
    sizes = {"x" * 64: 100 * MiB, "y" * 64: 10 * MiB}
    roomy = {"missing": ["y" * 64], "disk_free": 90 * MiB, "disk_path": "/w"}
    answers = {"a": roomy, "b": {"missing": []},
               "c": {"missing": ["x" * 64], "disk_free": 90 * MiB, "disk_path": "/w/c"}}
    with pytest.raises(NoRoom) as refused:
        refuse_without_room(plans, answers, sizes, "payload")
    assert str(refused.value) == (
        "c (ssh-c): 90.0 MiB free in /w/c, this push needs 100.0 MiB (174.0 MiB with the "
        "margin for logs and output) — no payload file was sent, nothing started")
    assert all("disk_free" not in a and "disk_path" not in a for a in answers.values())
    answers = {"a": {"missing": [], "disk_free": 10 * MiB, "disk_path": "/w"},
               "b": {"missing": []},
               "c": {"missing": ["x" * 64], "disk_free": 90 * MiB, "disk_path": "/w/c",
                     "shared_with": "a"}}
    with pytest.raises(NoRoom, match=r"^a \(10\.1\.2\.3\): 10\.0 MiB free in /w, this push "
                                     r"needs 0 B \(64\.0 MiB with"):
        refuse_without_room(plans, answers, sizes, "payload")


def test_versions_are_read_from_the_metadata_directories_names(tmp_path):
    for name in ("Tensorflow_CPU-2.20.0.dist-info", "tf_keras-2.21.0.dist-info", "numpy.egg-info",
                 "tensorflow_datasets-4.0.dist-info"):
        (tmp_path / name).mkdir()
    (tmp_path / "numpy.egg-info" / "PKG-INFO").write_text("Name: numpy\nVersion: 1.2.3\n\nbody\n")
    listed = distributions_along([str(tmp_path / "missing"), str(tmp_path)])
    assert version_of(("tensorflow", "tensorflow-cpu"), listed) == "2.20.0"
    assert version_of(("tf-keras",), listed) == "2.21.0"
    assert version_of(("numpy",), listed) == "1.2.3"
    assert version_of(("torch",), listed) is None


def test_the_agent_finds_the_packages_the_tasks_import(agent, tmp_path):
    """The agent runs with -I -S: its probe still sees this virtual environment's packages, as
    the tasks' python (with its site) does."""
    from importlib import metadata
    host = inventory(f"hosts:\n  - {{name: a, address: x, workdir: '{tmp_path}',"
                     f" python: '{sys.executable}'}}\n").hosts[0]
    answer = agent.agent.ask(probe_request(host), "probe").wait(60)
    assert answer.versions == {"tensorflow": metadata.version("tensorflow"),
                                  "tf_keras": metadata.version("tf-keras"),
                                  "numpy": metadata.version("numpy")}


def test_a_hosts_probe_is_answered_while_a_slower_host_still_starts(tmp_path):
    """The checks' probe goes right behind each host's agent (Session.open_each's `first`):
    a host that is up is probed while a slower one still starts, and the checks then take
    those answers instead of asking again."""
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 2\nexec '{sys.executable}' \"$@\"\n")
    slow.chmod(0o755)
    hosts = parse_inventory(
        f"hosts:\n  - {{name: a, transport: local, python: '{sys.executable}',"
        f" workdir: '{tmp_path}/a'}}\n"
        f"  - {{name: b, transport: local, python: '{slow}', workdir: '{tmp_path}/b'}}\n",
        "lab.yaml", environ={})
    ask, answered = probe_asker(), {}

    def first(host, agent):
        reply = ask(host, agent)
        threading.Thread(target=lambda: reply.done.wait(30) and answered.setdefault(
            host.name, time.monotonic()), daemon=True).start()
        return reply
    session, errors = Session.open_each(hosts.hosts, 30, False, first)
    try:
        assert errors == {}
        started = time.monotonic()        # b's agent is up: open_each waited for it
        assert answered["a"] < started - 1.0, "a's probe waited for b's start"
        report = run_checks(hosts, session)
        assert session.first_replies == {}
    finally:
        session.close()
    assert [c.problems for c in report.hosts] == [[], []]
    assert [c.probe.executable for c in report.hosts] == [sys.executable] * 2
