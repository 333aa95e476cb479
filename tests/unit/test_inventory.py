"""Inventory loading: good files become frozen values, bad ones name file, line, host, field."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from deploy.inventory import EnvValue, InventoryError, load_inventory, parse_inventory

BAD = Path(__file__).with_name("bad_inventories")

# file -> (line, host, field, words the message must contain)
EXPECTED = {
    "address_with_space": (3, "a", "address", "no spaces"),
    "bad_env_name": (4, "a", "env", "not a valid environment variable name"),
    "bad_policy": (4, "a", "host_key_policy", "strict, accept-new"),
    "bad_transport": (4, "a", "transport", "ssh, local"),
    "duplicate_name": (4, "a", "name", "duplicate name"),
    "empty_hosts": (1, None, "hosts", "non-empty list"),
    "env_list": (4, "a", "env", "mapping"),
    "invalid_yaml": (4, None, None, "not valid YAML"),
    "missing_address": (2, "a", "address", "missing"),
    "missing_name": (2, "#1", "name", "missing"),
    "port_high": (2, "a", "port", "between 1 and 65535"),
    "port_string": (4, "a", "port", "whole number"),
    "port_zero": (4, "a", "port", "between 1 and 65535"),
    "reserved_prefix": (4, "a", "env", "set by tfdeploy itself"),
    "reserved_tf_config": (4, "a", "env", "set by tfdeploy itself"),
    "same_machine_workdir": (4, "b", "workdir", "would collide"),
    "unknown_default": (2, None, "defaults.name", "unknown field"),
    "unknown_host_field": (4, "a", "wrokers", "unknown field"),
    "unknown_top": (4, None, "extra", "unknown top-level field"),
    "unset_var": (4, "a", "env", "is not set in this shell's environment"),
    "workdir_dotdot": (4, "a", "workdir", "'..'"),
    "workdir_home": (4, "a", "workdir", "directory of its own"),
    "workdir_relative": (4, "a", "workdir", "absolute"),
    "workdir_root": (4, "a", "workdir", "directory of its own"),
    "workers_word": (4, "a", "workers", "whole number"),
    "workers_zero": (4, "a", "workers", "at least 1"),
}


def test_corpus_and_table_match():
    assert sorted(p.stem for p in BAD.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_inventory_is_refused_with_a_located_message(name):
    line, host, field, words = EXPECTED[name]
    path = BAD / f"{name}.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(path, environ={})
    error = caught.value
    message = str(error)
    assert (error.line, error.host, error.field) == (line, host, field), message
    assert message.startswith(f"{path}:{line}: ")
    assert words in message
    if host:
        assert f"host {host!r}" in message
    if field:
        assert f"field {field!r}" in message


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(InventoryError, match="nope.yaml: cannot read inventory"):
        load_inventory(tmp_path / "nope.yaml")


def test_defaults_merge_and_values_are_frozen():
    text = """
defaults:
  user: alice
  port: 2222
  workdir: /srv/tf
hosts:
  - name: a
    address: 10.1.2.3
    workers: 2
    env: {GREETING: hello, N: 3}
  - name: b
    address: b.lab
    cluster_address: 10.1.2.4
    port: 22
"""
    inv = parse_inventory(text, "lab.yaml", environ={})
    a, b = inv.hosts
    assert (a.user, a.port, a.workdir, a.workers, a.transport) == ("alice", 2222, "/srv/tf", 2, "ssh")
    assert a.env == {"GREETING": EnvValue("hello"), "N": EnvValue("3")}
    assert a.tf_address == "10.1.2.3"
    assert (b.port, b.tf_address, b.python, b.known_hosts) == (22, "10.1.2.4", "python3",
                                                              "~/.ssh/known_hosts")
    assert inv.task_count == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.port = 1


def test_local_host_defaults_to_loopback_and_this_python():
    inv = parse_inventory("hosts:\n  - {name: here, transport: local}\n", "h.yaml", environ={})
    (host,) = inv.hosts
    assert host.address == "127.0.0.1"
    assert host.python == sys.executable


def test_secrets_from_the_environment_and_marked_in_the_file():
    text = """
hosts:
  - name: a
    address: 10.0.0.1
    env:
      API_KEY: ${MY_KEY}
      TOKEN: {value: abc, secret: true}
      PLAIN: {value: shown}
"""
    (host,) = parse_inventory(text, "s.yaml", environ={"MY_KEY": "k-123"}).hosts
    assert host.env["API_KEY"] == EnvValue("k-123", secret=True)
    assert host.env["TOKEN"] == EnvValue("abc", secret=True)
    assert host.env["PLAIN"] == EnvValue("shown", secret=False)
    assert host.env["API_KEY"].shown() == "***"


def test_the_default_inventory_is_two_local_workers():
    inv = load_inventory(Path(__file__).resolve().parents[2] / "hosts.yaml")
    assert [(h.transport, h.workers) for h in inv.hosts] == [("local", 2)]
