"""Inventory loading: good files become frozen values, bad ones name file, line, host, field.

The bad-inventory corpus is tests/unit/bad_inventories/NAME.yaml, one case per file; EXPECTED
below says, for each, where the error must point and which words its message must contain.
A file without an entry (or an entry without a file) fails test_corpus_and_table_match.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.inventory.load import (
    MAX_HOSTS, MAX_INVENTORY_BYTES, MAX_TASKS, MAX_WORKERS_PER_HOST, load_inventory,
    parse_inventory, workdir_problem
)
from deploy.inventory.model import EnvValue, Host, InventoryError

BAD = Path(__file__).with_name("bad_inventories")
REPO = Path(__file__).resolve().parents[2]
ANY = object()       # "don't check": used where a fixed version may reasonably differ

# file -> (line, host, field, fragments the message must contain)
#   line None: the error has no line (nothing in the file to point at)
#   host None / field None: the message names no host / no field
EXPECTED = {
    # unknown fields, at each level
    "unknown_top": (4, None, "extra", ["unknown top-level field", "defaults, hosts"]),
    "unknown_host_field": (4, "a", "wrokers", ["unknown field 'wrokers'", "workers"]),
    "unknown_default": (2, None, "defaults.name", ["unknown field 'name'"]),
    # wrong types
    "port_string": (4, "a", "port", ["whole number", "'22'"]),
    "port_bool": (4, "a", "port", ["whole number", "True"]),
    "workers_word": (4, "a", "workers", ["whole number", "'two'"]),
    "user_number": (4, "a", "user", ["must be a string", "1000"]),
    "env_list": (4, "a", "env", ["mapping of NAME: value"]),
    "env_value_list": (4, "a", "env", ["LIST", "string or number"]),
    "env_secret_typo": (4, "a", "env", ["TOKEN", "{value: ..., secret: true}"]),
    "defaults_wrong_type": (2, "a", "workers", ["whole number", "'2'"]),  # line of the default
    "defaults_not_mapping": (1, None, "defaults", ["must be a mapping"]),
    "not_a_mapping": (1, None, None, ["expected a mapping with a 'hosts' list"]),
    "empty_file": (None, None, None, ["expected a mapping with a 'hosts' list"]),
    "hosts_not_list": (1, None, "hosts", ["non-empty list"]),
    "host_not_mapping": (2, None, "hosts", ["host #1 must be a mapping"]),
    # names
    "duplicate_name": (4, "a", "name", ["duplicate name", "also host #1"]),
    "missing_name": (2, "#1", "name", ["missing"]),
    "bad_host_name": (2, "a b", "name", ["letters, digits"]),
    # address, port, workers
    "missing_address": (2, "a", "address", ["missing", "SSH"]),
    "address_with_space": (3, "a", "address", ["no spaces"]),
    "address_v6_unquoted_brackets": (3, "a", "address", ["YAML reads", "as a list",
                                                         "quote it"]),
    "address_with_port": (3, "a", "address", ["'gpu-a.lab:2222'", "port goes in its own field"]),
    "cluster_address_v4_in_brackets": (4, "a", "cluster_address",
                                       ["only an IPv6 address goes in brackets"]),
    "port_zero": (4, "a", "port", ["between 1 and 65535", "not 0"]),
    "port_high": (2, "a", "port", ["between 1 and 65535", "not 70000"]),   # set in defaults
    "workers_zero": (4, "a", "workers", ["at least 1", "not 0"]),
    "workers_zero_second_host": (7, "b", "workers", ["at least 1"]),
    # workdir
    "workdir_root": (4, "a", "workdir", ["directory of its own", "'/'"]),
    "workdir_home": (4, "a", "workdir", ["directory of its own", "'~'"]),
    "workdir_relative": (4, "a", "workdir", ["absolute or start with ~/", "'relative/dir'"]),
    "workdir_dotdot": (4, "a", "workdir", ["'..'", "'~/../x'"]),
    "same_machine_workdir": (4, "b", "workdir", ["same machine and workdir as host 'a'",
                                                 "would collide"]),
    "same_ssh_target_workdir": (8, "c", "workdir", ["same machine and workdir as host 'b'"]),
    # YAML itself
    "invalid_yaml": (4, None, None, ["not valid YAML"]),
    "invalid_yaml_indent": (5, None, None, ["not valid YAML"]),
    "empty_hosts": (1, None, "hosts", ["non-empty list"]),
    # env
    "bad_env_name": (4, "a", "env", ["1BAD", "not a valid environment variable name"]),
    "reserved_tf_config": (4, "a", "env", ["TF_CONFIG", "set by tfdeploy itself"]),
    "reserved_prefix": (4, "a", "env", ["TFDEPLOY_X", "set by tfdeploy itself"]),
    "unset_var": (4, "a", "env", ["TOKEN", "${TFDEPLOY_TEST_UNSET_VAR} is not set"]),
    # transport, host key policy
    "bad_transport": (4, "a", "transport", ["ssh, local", "'telnet'"]),
    "bad_policy": (4, "a", "host_key_policy", ["strict, accept-new", "'yes-to-all'"]),
    # gpus
    "gpus_with_workers": (5, "a", "workers", ["cannot be combined with a gpus list",
                                              "2 here"]),
    "gpus_with_workers_default": (2, "b", "workers", ["cannot be combined with a gpus list",
                                                      "3 here"]),       # line of the default
    "gpus_all_with_workers": (5, "a", "workers", ["gpus: all gives one task"]),
    "gpus_word": (4, "a", "gpus", ["list of GPU indices", "or all", "'some'"]),
    "gpus_negative": (4, "a", "gpus", ["list of GPU indices", "-1"]),
    "gpus_empty": (4, "a", "gpus", ["list of GPU indices", "[]"]),
    "gpus_twice": (4, "a", "gpus", ["GPU 1 more than once"]),
    "gpus_and_cuda_env": (5, "a", "env", ["CUDA_VISIBLE_DEVICES", "set from `gpus`"]),
    # data (local paths are relative to the inventory file's directory)
    "data_missing_dir": (4, "a", "data", ["local:", "does not exist", "no-such-shards"]),
    "data_not_dir": (4, "a", "data", ["local:", "data_not_dir.yaml", "is not a directory"]),
    "data_both": (4, "a", "data", ["either local or remote, not both"]),
    "data_unknown_key": (4, "a", "data", ["unknown key 'path'", "local, remote"]),
    "data_remote_relative": (4, "a", "data", ["remote:", "absolute or start with ~/",
                                              "'datasets/mnist'"]),
    "data_remote_dotdot": (4, "a", "data", ["remote:", "'..'"]),
    "data_plain_string": (4, "a", "data", ["{local: DIR}", "{remote: PATH}",
                                           "'/srv/datasets/mnist'"]),
    "data_local_empty": (4, "a", "data", ["non-empty path"]),
    "data_default_missing": (2, "a", "data", ["does not exist", "shards-nowhere"]),  # default
    # gateways and ssh config
    "jump_bad_port": (4, "a", "jump", ["'admin@gw:99999' is not a gateway",
                                       "[user@]host[:port]"]),
    "jump_with_space": (4, "a", "jump", ["no spaces"]),
    "jump_empty_hop": (2, "a", "jump", ["'' is not a gateway"]),        # line of the default
    "jump_on_local_host": (4, "here", "jump", ["local host is not reached over SSH"]),
    "ssh_config_missing": (4, "a", "ssh_config", [
        "cannot read ssh config /nonexistent/tfdeploy-test/ssh_config",
        "No such file or directory"]),
    "ssh_config_number": (2, "a", "ssh_config", ["must be a string", "22"]),
}

# Inputs that once slipped through or crashed the loader: (what went wrong, the exception it
# raised instead or None, what the error must at least say).
REGRESSIONS = {
    "port_null": ("`port:` with no value (null) crashes with TypeError instead of an "
                  "InventoryError", TypeError, (4, "a", "port", [])),
    "workers_null": ("`workers: ~` (null, e.g. to undo a default) crashes with TypeError "
                     "instead of an InventoryError", TypeError, (6, "a", "workers", [])),
    "name_trailing_newline": ("HOST_NAME uses `$`, which also matches before a final newline, "
                              "so the name 'a\\n' is accepted", None, (2, ANY, "name", [])),
    "env_name_trailing_newline": ("ENV_NAME uses `$`, which also matches before a final "
                                  "newline, so the variable 'FOO\\n' is accepted", None,
                                  (4, "a", "env", [])),
    "recursive_alias": ("a self-referencing YAML alias makes _Located._walk recurse forever "
                        "(RecursionError)", RecursionError, (ANY, ANY, ANY, [])),
    "same_workdir_spelled_twice": ("workdirs are compared as strings: /srv/tf and /srv//tf on "
                                   "one machine collide but are accepted", None,
                                   (5, "b", "workdir", ["would collide"])),
    "defaults_empty_list": ("`defaults: []` is read as no defaults instead of refused", None,
                            (1, None, "defaults", ["must be a mapping"])),
    "env_secret_string": ("`secret: \"false\"` (a string) counts as secret", None,
                          (4, "a", "env", ["TOKEN", "true or false", "'false'"])),
    "reserved_legacy_keras": ("a host's env may set TF_USE_LEGACY_KERAS=0 and bring back "
                              "Keras 3", None, (4, "a", "env", ["TF_USE_LEGACY_KERAS",
                                                                "set by tfdeploy itself"])),
    "not_utf8": ("a file that is not UTF-8 raises UnicodeDecodeError (no file name) instead "
                 "of an InventoryError", UnicodeDecodeError, (ANY, None, None, [])),
}


def test_corpus_and_table_match():
    assert sorted(p.stem for p in BAD.glob("*.yaml")) == sorted({**EXPECTED, **REGRESSIONS})
    assert not set(EXPECTED) & set(REGRESSIONS)


def check_located(path: Path, expected) -> None:
    line, host, field, fragments = expected
    with pytest.raises(InventoryError) as caught:
        load_inventory(path, environ={})
    error = caught.value
    message = str(error)
    assert error.file == str(path)
    where = f"{path}:{error.line}: " if error.line else f"{path}: "
    assert message.startswith(where), message
    if line is not ANY:
        assert error.line == line, message
    for kind, want in (("host", host), ("field", field)):
        if want is ANY:
            continue
        assert getattr(error, kind) == want, message
        if want is None:
            assert f": {kind} '" not in message
        else:
            assert f": {kind} {want!r}: " in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_inventory_is_refused_with_a_located_message(name):
    check_located(BAD / f"{name}.yaml", EXPECTED[name])


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_inputs_that_once_crashed_the_loader_are_refused_cleanly(name):
    check_located(BAD / f"{name}.yaml", REGRESSIONS[name][2])


def test_message_format_matches_the_readme():
    text = "hosts:\n  - name: a\n    address: h\n  - name: b\n    address: h2\n\n    workers: 0\n"
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "lab.yaml", environ={})
    assert str(caught.value) == "lab.yaml:7: host 'b': field 'workers': must be at least 1, not 0"


def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(missing)
    assert str(caught.value) == f"{missing}: cannot read inventory: No such file or directory"
    assert caught.value.file == str(missing) and caught.value.line is None


def test_unreadable_inventory_names_the_file(tmp_path):
    # A directory cannot be read as a file even by root (a chmod 000 file can).
    with pytest.raises(InventoryError, match=rf"^{tmp_path}: cannot read inventory: Is a directory"):
        load_inventory(tmp_path)


# ---- good inventories --------------------------------------------------------------------

def parse(text: str, environ=None):
    return parse_inventory(text, "good.yaml", environ={} if environ is None else environ)


def test_defaults_merge_and_values_are_frozen():
    text = """
defaults:
  user: alice
  port: 2222
  workdir: /srv/tf/
  identity_file: ~/.ssh/lab
  host_key_policy: accept-new
  env: {FROM_DEFAULTS: d, OVERRIDDEN: d}
hosts:
  - name: a
    address: 10.1.2.3
    workers: 2
    env: {GREETING: hello, N: 3, F: 0.5, OVERRIDDEN: mine}
  - name: b
    address: b.lab
    cluster_address: 10.1.2.4
    port: 22
    user: bob
"""
    inv = parse(text)
    a, b = inv.hosts
    assert a == Host(name="a", address="10.1.2.3", transport="ssh", port=2222, user="alice",
                     identity_file="~/.ssh/lab", known_hosts="~/.ssh/known_hosts",
                     host_key_policy="accept-new", python="python3", workdir="/srv/tf",
                     cluster_address="", workers=2,
                     # The login; its other resolved fields (known_hosts files...) as they are.
                     target=dataclasses.replace(a.target, name="10.1.2.3",
                                                hostname="10.1.2.3", port=2222, user="alice",
                                                identity_files=("~/.ssh/lab",)),
                     env={"FROM_DEFAULTS": EnvValue("d"), "OVERRIDDEN": EnvValue("mine"),
                          "GREETING": EnvValue("hello"), "N": EnvValue("3"),
                          "F": EnvValue("0.5")})
    # A host's own value wins over the default; env merges name by name.
    assert (b.port, b.user, b.workers, b.workdir) == (22, "bob", 1, "/srv/tf")
    assert b.env == {"FROM_DEFAULTS": EnvValue("d"), "OVERRIDDEN": EnvValue("d")}
    assert inv.task_count == 3 and inv.path == "good.yaml"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.port = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.env["GREETING"].value = "x"
    assert isinstance(inv.hosts, tuple)


def test_cluster_address_defaults_to_the_ssh_address():
    a, b = parse("hosts:\n  - {name: a, address: gpu-a.lab}\n"
                 "  - {name: b, address: gpu-b.lab, cluster_address: 10.0.0.2}\n").hosts
    assert (a.cluster_address, str(a.tf_address), a.label) == ("", "gpu-a.lab",
                                                                "a (gpu-a.lab)")
    assert (b.cluster_address, str(b.tf_address)) == ("10.0.0.2", "10.0.0.2")


def test_local_host_defaults_to_loopback_and_this_python():
    (host,) = parse("hosts:\n  - {name: here, transport: local}\n").hosts
    assert (host.address, host.python, str(host.tf_address)) == ("127.0.0.1", sys.executable,
                                                                "127.0.0.1")
    assert host.label == "here"
    # Explicit values still win, and an ssh host keeps python3.
    (mine,) = parse("hosts:\n  - {name: here, transport: local, python: /opt/py, "
                    "address: 10.9.9.9}\n").hosts
    assert (mine.python, mine.address) == ("/opt/py", "10.9.9.9")
    (remote,) = parse("hosts:\n  - {name: r, address: r.lab}\n").hosts
    assert remote.python == "python3"


def test_secrets_from_the_environment_and_marked_in_the_file():
    text = """
hosts:
  - name: a
    address: 10.0.0.1
    env:
      API_KEY: ${MY_KEY}
      TOKEN: {value: abc, secret: true}
      PLAIN: {value: shown}
      NOT_SECRET: {value: 7, secret: false}
"""
    (host,) = parse(text, environ={"MY_KEY": "k-123 $(x)"}).hosts
    assert host.env == {"API_KEY": EnvValue("k-123 $(x)", secret=True),
                        "TOKEN": EnvValue("abc", secret=True),
                        "PLAIN": EnvValue("shown", secret=False),
                        "NOT_SECRET": EnvValue("7", secret=False)}
    assert host.env["API_KEY"].shown() == "***" and host.env["TOKEN"].shown() == "***"
    assert host.env["PLAIN"].shown() == "shown"


def test_env_vars_come_from_the_given_mapping_not_os_environ(monkeypatch, tmp_path):
    monkeypatch.setenv("TFD_UNIT_ONLY_IN_OS", "from-os")
    text = "hosts:\n  - {name: a, address: h, env: {K: '${TFD_UNIT_ONLY_IN_OS}'}}\n"
    with pytest.raises(InventoryError, match=r"\$\{TFD_UNIT_ONLY_IN_OS\} is not set"):
        parse(text, environ={})
    assert parse(text, environ={"TFD_UNIT_ONLY_IN_OS": "given"}).hosts[0].env["K"].value == "given"
    # load_inventory without a mapping uses this process's environment.
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    assert load_inventory(path).hosts[0].env["K"] == EnvValue("from-os", secret=True)


def test_the_default_inventory_is_two_local_workers():
    inv = load_inventory(REPO / "hosts.yaml", environ={})
    assert [(h.name, h.transport, h.workers, h.address, h.python) for h in inv.hosts] == [
        ("local", "local", 2, "127.0.0.1", sys.executable)]


def test_a_local_and_an_ssh_host_may_share_a_workdir_string():
    # Different machines: no collision even though the workdir strings are equal.
    inv = parse("hosts:\n  - {name: a, transport: local}\n  - {name: b, address: 10.0.0.1}\n"
                "  - {name: c, address: 10.0.0.1, port: 2222}\n")
    assert [h.name for h in inv.hosts] == ["a", "b", "c"]


# ---- properties of single fields -----------------------------------------------------------

def one_host(**fields) -> str:
    body = ", ".join(f"{k}: {v}" for k, v in fields.items())
    return "hosts:\n  - {name: a, address: h, " + body + "}\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=-10**6, max_value=10**6))
def test_port_is_accepted_exactly_in_range(port):
    try:
        host = parse(one_host(port=port)).hosts[0]
    except InventoryError as exc:
        assert not 1 <= port <= 65535
        assert exc.field == "port" and f"not {port}" in str(exc)
    else:
        assert 1 <= port <= 65535 and host.port == port


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=-1000, max_value=1000))
def test_workers_must_be_positive(workers):
    try:
        host = parse(one_host(workers=workers)).hosts[0]
    except InventoryError as exc:
        assert not 1 <= workers <= MAX_WORKERS_PER_HOST and exc.field == "workers"
    else:
        assert 1 <= workers <= MAX_WORKERS_PER_HOST and host.workers == workers


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="/~.ax-", max_size=12))
def test_an_accepted_workdir_is_a_directory_of_its_own(workdir):
    if workdir_problem(workdir) is None:
        assert workdir.startswith("/") or workdir.startswith("~/")
        parts = [p for p in workdir.split("/") if p not in ("", ".")]
        assert ".." not in parts
        assert parts and parts != ["~"]


# ---- bounds ----------------------------------------------------------------------------------

def test_a_typo_in_workers_is_refused_at_once_naming_the_field():
    with pytest.raises(InventoryError, match=r"field 'workers': must be at most 128") as caught:
        parse(one_host(workers=1000000000))
    assert caught.value.host == "a" and caught.value.line == 2


def test_too_many_hosts_or_tasks_are_refused_naming_the_field():
    many = "hosts:\n" + "".join(f"  - {{name: h{i}, address: 10.0.{i // 200}.{i % 200 + 1}}}\n"
                                for i in range(MAX_HOSTS + 1))
    with pytest.raises(InventoryError, match=rf"field 'hosts': lists {MAX_HOSTS + 1} hosts"):
        parse(many)
    hosts = MAX_TASKS // MAX_WORKERS_PER_HOST + 1
    crowded = "hosts:\n" + "".join(
        f"  - {{name: h{i}, address: 10.0.0.{i + 1}, workers: {MAX_WORKERS_PER_HOST}}}\n"
        for i in range(hosts))
    with pytest.raises(InventoryError, match=rf"host 'h{hosts - 1}': field 'workers': brings "
                                             rf"the run to {MAX_TASKS + MAX_WORKERS_PER_HOST}"):
        parse(crowded)


def test_an_inventory_file_past_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"#" * (MAX_INVENTORY_BYTES + 1))
    with pytest.raises(InventoryError, match="larger than 1 MiB"):
        load_inventory(path)
