"""ssh config and gateways, resolved when the inventory is loaded: aliases, precedence of the
inventory over the config, Include, ProxyJump chains, `jump:`, and what downstream sees (the
cluster address, labels, the same-machine check, the lints, the run record)."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import paramiko
import pytest

from deploy.inventory import openssh, sshconfig
from deploy.inventory.load import load_inventory
from deploy.inventory.model import InventoryError
from deploy.inventory.sshconfig import Hop, SshConfigError, parse_hops
from deploy.plan.lints import cluster_problems, endpoint_problems
from deploy.plan.planner import Options, plan_run
from deploy.plan.text import plan_text
from deploy.transport import hostkeys
from deploy.state.record import RunRecord, RunState, load_record, write_record

CONFIG = """
Host lab-a
    HostName 10.0.0.5
    Port 2201
    User alice
    IdentityFile ~/keys/lab-a
    UserKnownHostsFile /etc/lab/known_hosts /ignored/second
Host lab-b
    HostName 10.0.0.6
Host gw
    HostName 192.0.2.1
    User admin
    Port 2222
    IdentityFile /keys/gw
Host bastion
    HostName 192.0.2.9
    ProxyJump gw
Host behind-*
    ProxyJump gw
Host behind-1
    HostName 10.1.0.1
Host *
    User everyone
"""


@pytest.fixture(params=["ssh -G", "parser"], autouse=True)
def resolver(request, monkeypatch):
    """Every test twice: resolved by OpenSSH, and by tfdeploy's parser (no `ssh` installed).
    A test of one of them only names it: @pytest.mark.parametrize("resolver", [...])."""
    if request.param == "parser":
        monkeypatch.setattr(openssh, "available", lambda: False)
    return request.param


PARSER_ONLY = pytest.mark.parametrize("resolver", ["parser"], indirect=True)


def inventory(tmp_path: Path, hosts: str, config: str = CONFIG, defaults: str = ""):
    (tmp_path / "ssh_config").write_text(config)
    path = tmp_path / "hosts.yaml"
    path.write_text(f"defaults:\n  ssh_config: {tmp_path / 'ssh_config'}\n{defaults}"
                    f"hosts:\n{hosts}")
    return load_inventory(path, environ={})


def login(hop: Hop) -> tuple:
    """The login itself: the other fields of a Hop (known_hosts files, ...) have tests of
    their own."""
    return hop.name, hop.hostname, hop.port, hop.user, hop.identity_files


def one(tmp_path, host: str, **kw):
    (found,) = inventory(tmp_path, f"  - {{name: a, {host}}}\n", **kw).hosts
    return found


def test_an_alias_resolves_as_ssh_resolves_it(tmp_path):
    host = one(tmp_path, "address: lab-a")
    assert login(host.ssh) == login(Hop("lab-a", "10.0.0.5", 2201, "alice",
                                        (str(Path("~/keys/lab-a").expanduser()),)))
    # The other hosts reach its TF ports at the HostName; an alias means nothing there.
    assert str(host.tf_address) == "10.0.0.5" and host.cluster_address == ""
    assert host.label == "a (lab-a = 10.0.0.5)"
    assert host.known_hosts == "~/.ssh/known_hosts"      # the inventory's field, not given
    assert host.ssh.known_hosts == ("/etc/lab/known_hosts", "/ignored/second")   # every file
    assert host.via == () and host.port is None and host.user is None


def test_the_inventory_wins_over_the_config(tmp_path):
    host = one(tmp_path, "address: lab-a, port: 22, user: bob, identity_file: /keys/mine, "
                         "known_hosts: /kh, cluster_address: 10.9.9.9")
    assert (host.ssh.port, host.ssh.user, host.known_hosts) == (22, "bob", "/kh")
    assert host.ssh.known_hosts == ("/kh",)          # instead of the config's files
    # Both keys are offered, the inventory's first (like ssh -i beside IdentityFile).
    assert host.ssh.identity_files == ("/keys/mine", str(Path("~/keys/lab-a").expanduser()))
    assert str(host.tf_address) == "10.9.9.9"


def test_no_entry_and_no_file_leave_the_address_and_defaults(tmp_path, resolver):
    plain = one(tmp_path, "address: 10.2.3.4")
    assert login(plain.ssh) == login(Hop("10.2.3.4", "10.2.3.4", 22, "everyone", ()))  # `Host *`
    assert plain.label == "a (10.2.3.4)" and plain.known_hosts == "~/.ssh/known_hosts"
    # The files read: OpenSSH's default ones, ~ expanded as ssh expands it.
    home = openssh.home() if resolver == "ssh -G" else str(Path.home())
    assert plain.ssh.known_hosts == (f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2")
    bare = one(tmp_path, "address: lab-a, ssh_config: none")
    assert login(bare.ssh) == login(Hop("lab-a", "lab-a", 22, None, ()))


def test_the_default_file_is_the_users_then_the_systems(tmp_path, monkeypatch):
    user, system = tmp_path / "user_config", tmp_path / "system_config"
    user.write_text("Host lab-a\n    HostName 10.0.0.5\n")
    system.write_text("Host *\n    Port 2299\n    HostName wrong\n")
    monkeypatch.setattr(sshconfig, "USER_FILE", str(user))
    monkeypatch.setattr(sshconfig, "SYSTEM_FILE", str(system))
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  - {name: a, address: lab-a}\n")
    (host,) = load_inventory(path, environ={}).hosts
    assert (host.ssh.hostname, host.ssh.port) == ("10.0.0.5", 2299)   # first value wins
    user.unlink()
    system.unlink()
    (host,) = load_inventory(path, environ={}).hosts                  # missing default: none
    assert login(host.ssh) == login(Hop("lab-a", "lab-a", 22, None, ()))


# OpenSSH resolves a relative Include against the account's ~/.ssh, which a test cannot
# move (HOME does not); tests/ssh_corpus has Includes that `ssh -G` resolves.
@PARSER_ONLY
def test_include_relative_to_dot_ssh_and_absolute(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / ".ssh" / "conf.d" / "a.conf").write_text("Host lab-a\n    HostName 10.0.0.5\n")
    (tmp_path / "b.conf").write_text("Host lab-b\n    HostName 10.0.0.6\n    Port 2202\n")
    hosts = inventory(tmp_path, "  - {name: a, address: lab-a, workdir: /w/a}\n"
                                "  - {name: b, address: lab-b, workdir: /w/b}\n",
                      config=f"Include conf.d/*.conf {tmp_path}/b.conf\n").hosts
    assert [(h.ssh.hostname, h.ssh.port) for h in hosts] == [("10.0.0.5", 22),
                                                              ("10.0.0.6", 2202)]


def test_include_loop_is_an_error_not_a_hang(tmp_path, resolver):
    loop = tmp_path / "loop.conf"
    loop.write_text(f"Include {loop}\n")
    words = {"parser": "Include nested more than 16 deep",
             "ssh -G": "ssh refuses .*: Too many recursive configuration includes"}[resolver]
    with pytest.raises(InventoryError, match=words):
        one(tmp_path, "address: lab-a", config=f"Include {loop}\n")


def test_proxyjump_from_the_config_and_jump_from_the_inventory(tmp_path):
    behind = one(tmp_path, "address: behind-1, identity_file: /keys/host")
    assert [login(h) for h in behind.via] == [
        login(Hop("gw", "192.0.2.1", 2222, "admin", ("/keys/gw", "/keys/host")))]
    assert behind.label == "a (behind-1 = 10.1.0.1 via gw)"
    # The inventory's jump wins over the config's ProxyJump; `jump: none` turns it off.
    mine = one(tmp_path, "address: behind-1, jump: 'root@10.7.7.7:2200'")
    assert [login(h) for h in mine.via] == [
        login(Hop("root@10.7.7.7:2200", "10.7.7.7", 2200, "root", ()))]
    assert one(tmp_path, "address: behind-1, jump: none").via == ()


def test_a_chain_and_a_first_hop_with_its_own_proxyjump(tmp_path):
    chained = one(tmp_path, "address: lab-b, jump: 'gw,ops@10.5.5.5'")
    assert [(h.name, h.hostname, h.user) for h in chained.via] == [
        ("gw", "192.0.2.1", "admin"), ("ops@10.5.5.5", "10.5.5.5", "ops")]
    # bastion is reached through gw (its own ProxyJump), as `ssh -J bastion` would.
    via_bastion = one(tmp_path, "address: lab-b, jump: bastion")
    assert [h.hostname for h in via_bastion.via] == ["192.0.2.1", "192.0.2.9"]
    # The gateway's user is its own (spec, config, else the local user), not the host's.
    assert one(tmp_path, "address: lab-b, user: bob, jump: bastion").via[1].user == "everyone"


def test_a_proxyjump_for_every_host_does_not_loop_on_the_gateway(tmp_path):
    config = "Host gw\n    HostName 192.0.2.1\nHost *\n    ProxyJump gw\n"
    host = one(tmp_path, "address: 10.1.0.1", config=config)
    assert [h.hostname for h in host.via] == ["192.0.2.1"]
    looping = "Host a\n    ProxyJump b\nHost b\n    ProxyJump a\n"
    with pytest.raises(InventoryError, match="longer than 8 hops"):
        one(tmp_path, "address: x, jump: a", config=looping)


@pytest.mark.parametrize("config, field, words", [
    ("Host lab-a\n    Port many\n", "ssh_config", "Port 'many', which is not a port number"),
    ("Host lab-a\n    ProxyCommand nc %h %p\n", "address", "ProxyCommand"),
    ("Host lab-a\n    ProxyJump bad:port:x\n", "ssh_config", "'bad:port:x' is not a gateway"),
])
@PARSER_ONLY
def test_config_problems_name_the_host_and_field(tmp_path, config, field, words):
    with pytest.raises(InventoryError) as caught:
        one(tmp_path, "address: lab-a", config=config)
    assert caught.value.host == "a" and caught.value.field == field
    assert words in str(caught.value)


@pytest.mark.parametrize("spec, hops", [
    ("gw", [(None, "gw", None)]),
    ("admin@gw.example:2222", [("admin", "gw.example", 2222)]),
    ("ssh://admin@gw:22", [("admin", "gw", 22)]),
    ("[fd00::1]:2200,ops@gw2", [(None, "fd00::1", 2200), ("ops", "gw2", None)]),
    # Brackets hold any host, as ssh reads them.
    ("ops@[10.20.0.1]:2200", [("ops", "10.20.0.1", 2200)]),
    ("[gw.lab]:2201", [(None, "gw.lab", 2201)]),
])
def test_gateway_specs(spec, hops):
    assert parse_hops(spec) == hops


def test_a_bracketed_gateway_name_is_checked_as_any_name():
    with pytest.raises(SshConfigError, match="metacharacter"):
        parse_hops("[gw;id]:22")


@pytest.mark.parametrize("printed, files", [
    ("/root/Library/Application Support/ssh/known_hosts /root/.ssh/kh2",
     ("/root/Library/Application Support/ssh/known_hosts", "/root/.ssh/kh2")),
    ("~/global_known /etc/ssh/with space/known", ("~/global_known", "/etc/ssh/with space/known")),
    ("/etc/a /etc/b", ("/etc/a", "/etc/b")),
    ("none", ()),
])
def test_known_hosts_files_as_ssh_g_prints_them(printed, files):
    """`ssh -G` joins the files with spaces, unquoted: a word that starts a file starts with /
    or ~, any other goes on the file before it."""
    assert openssh._file_list({"userknownhostsfile": [printed]}, "userknownhostsfile") == files


def test_tilde_as_ssh_expands_it(monkeypatch):
    import pwd
    monkeypatch.setenv("HOME", "/nowhere")          # ssh reads the password database
    own = pwd.getpwuid(os.getuid()).pw_dir
    assert openssh.expand_tilde("~/kh") == own.rstrip("/") + "/kh"
    assert openssh.expand_tilde("~") == own
    assert openssh.expand_tilde("~root/kh") == pwd.getpwnam("root").pw_dir.rstrip("/") + "/kh"
    assert openssh.expand_tilde("~no-such-user-here/kh") == "~no-such-user-here/kh"
    assert openssh.expand_tilde("/etc/kh~") == "/etc/kh~"


@pytest.mark.parametrize("spec", ["", "a@", ":22", "gw:0", "gw:x", "a@b@c", "gw,", "g w"])
def test_bad_gateway_specs(spec):
    with pytest.raises(SshConfigError, match="is not a gateway"):
        parse_hops(spec)


def test_two_aliases_of_one_machine_collide_and_one_address_behind_two_gateways_does_not(
        tmp_path):
    config = "Host lab-a2\n    HostName 10.0.0.5\n    Port 2201\n    User alice\n" + CONFIG
    with pytest.raises(InventoryError, match="same machine and workdir as host 'a'"):
        inventory(tmp_path, "  - {name: a, address: lab-a}\n  - {name: b, address: lab-a2}\n",
                  config=config)
    hosts = inventory(tmp_path, "  - {name: a, address: 10.0.0.5, jump: gw}\n"
                                "  - {name: b, address: 10.0.0.5, jump: bastion}\n").hosts
    assert [h.via[-1].hostname for h in hosts] == ["192.0.2.1", "192.0.2.9"]


def test_lints_see_the_resolved_address(tmp_path):
    config = CONFIG + "Host here\n    HostName 127.0.0.1\n"
    inv = inventory(tmp_path, "  - {name: a, address: here}\n  - {name: b, address: lab-b}\n",
                    config=config)
    assert "cluster address '127.0.0.1' is loopback" in cluster_problems(inv)[0]
    # Two aliases of one HostName: one machine, no endpoint clash.
    same = inventory(tmp_path, "  - {name: a, address: lab-b, workdir: /w/a}\n"
                               "  - {name: b, address: 10.0.0.6, workdir: /w/b}\n")
    assert endpoint_problems(same) == []
    # One private address behind two gateways: two machines that cannot share it.
    two = inventory(tmp_path, "  - {name: a, address: 10.0.0.5, jump: gw}\n"
                              "  - {name: b, address: 10.0.0.5, jump: bastion}\n")
    (problem,) = endpoint_problems(two)
    assert "(10.0.0.5 via gw, 10.0.0.5 via gw,bastion)" in problem


def test_dry_run_shows_the_login_and_the_gateways(tmp_path):
    inv = inventory(tmp_path, "  - {name: a, address: lab-a}\n"
                              "  - {name: b, address: behind-1, jump: 'gw,ops@10.5.5.5'}\n")
    text = plan_text(plan_run(inv, Options(), "20260101-000000-abcdef", {0: 20000, 1: 20001}))
    assert "host a (ssh alice@10.0.0.5:2201 (alias lab-a))" in text
    assert ("host b (ssh everyone@10.1.0.1:22 (alias behind-1) via gw (admin@192.0.2.1:2222), "
            "then ops@10.5.5.5)") in text
    assert 'cluster: {"worker":["10.0.0.5:20000","10.1.0.1:20001"]}' in text


def test_the_record_keeps_the_resolved_logins_whatever_the_config_says_later(tmp_path):
    inv = inventory(tmp_path, "  - {name: a, address: lab-a}\n"
                              "  - {name: b, address: behind-1, identity_file: /k}\n")
    plan = plan_run(inv, Options(), "20260101-000000-abcdef", {0: 20000, 1: 20001})
    run_dir = tmp_path / "runs" / plan.run_id
    run_dir.mkdir(parents=True)
    write_record(run_dir, RunRecord.of(plan, RunState.DETACHED, time.time()))
    (tmp_path / "ssh_config").write_text("Host *\n    HostName elsewhere\n")
    record = load_record(run_dir)
    assert record.hosts == inv.hosts
    again = record.plan()
    assert [t.endpoint for t in again.tasks] == ["10.0.0.5:20000", "10.1.0.1:20001"]
    assert [t.launch for t in again.tasks] == [t.launch for t in plan.tasks]
    # A record written before these fields existed still loads, with their defaults.
    doc = record.document()
    for fields in doc["hosts"]:
        for key in ("ssh_config", "jump", "target", "via"):
            del fields[key]
    old = RunRecord.from_document(doc, "old record").hosts
    assert [h.ssh.hostname for h in old] == ["lab-a", "behind-1"]
    assert list(old) == [dataclasses.replace(h, target=None, via=(), jump=None,
                                             ssh_config=sshconfig.DEFAULT_FILE)
                         for h in inv.hosts]


def test_the_keyscan_hint_names_the_address_and_where_to_run_it():
    key = paramiko.RSAKey.generate(1024)
    for name, scan_from, hint in [
            ("[10.0.0.5]:2222", "", "ssh-keyscan -p 2222 10.0.0.5 >> /kh"),
            ("gw.example", "", "ssh-keyscan -p 22 gw.example >> /kh"),
            ("[10.0.0.5]:2222", "ssh ssh://admin@gw:22 ",
             "ssh ssh://admin@gw:22 ssh-keyscan -p 2222 10.0.0.5 >> /kh")]:
        port = int(name.rsplit(":", 1)[1]) if name.startswith("[") else 22
        hop = Hop("x", name.strip("[").split("]")[0], port)
        policy = hostkeys.OpenSshCheck("a (x)", hop, ("/kh",), False, scan_from)
        with pytest.raises(hostkeys.HostKeyRefused) as caught:
            policy.missing_host_key(None, name, key)
        assert str(caught.value).endswith("or add it with: " + hint)
