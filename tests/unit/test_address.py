"""Addresses as values: IPv4, IPv6 (bare or in brackets) and host names, each printed the way
TF_CONFIG, ssh and messages need it; and IPv6 inventories through loading and the ssh config."""
from __future__ import annotations

import ipaddress

import pytest

from deploy.inventory.address import Address
from deploy.inventory.load import parse_inventory
from deploy.inventory.model import InventoryError
from deploy.inventory.sshconfig import Hop, SshConfigError, parse_hops


@pytest.mark.parametrize("given, text, with_port", [
    ("10.0.0.5", "10.0.0.5", "10.0.0.5:2222"),
    ("2001:db8::1", "2001:db8::1", "[2001:db8::1]:2222"),
    ("[2001:db8::1]", "2001:db8::1", "[2001:db8::1]:2222"),
    ("::1", "::1", "[::1]:2222"),
    ("::ffff:10.0.0.5", "::ffff:10.0.0.5", "[::ffff:10.0.0.5]:2222"),
    ("fe80::1%eth0", "fe80::1%eth0", "[fe80::1%eth0]:2222"),
    ("gpu-a.lab", "gpu-a.lab", "gpu-a.lab:2222"),
])
def test_each_form_prints_bare_alone_and_bracketed_with_a_port(given, text, with_port):
    address = Address.parse(given)
    assert str(address) == text
    assert address.with_port(2222) == with_port
    assert address.is_v6 == (":" in text)


def test_a_bracketed_endpoint_splits_back_into_address_and_port():
    """What TensorFlow does with a TF_CONFIG entry: the last colon after the bracket."""
    endpoint = Address.parse("2001:db8::10").with_port(20001)
    host, _, port = endpoint.rpartition(":")
    assert ipaddress.ip_address(host.strip("[]")) == ipaddress.ip_address("2001:db8::10")
    assert port == "20001"


def test_names_are_kept_as_given_and_never_resolved():
    address = Address.parse("v6-only.example")
    assert address.ip is None and not address.is_v6 and str(address) == "v6-only.example"


@pytest.mark.parametrize("given, words", [
    ("[10.0.0.5]", "only an IPv6 address goes in brackets"),
    ("[gpu-a.lab]", "only an IPv6 address goes in brackets"),
    ("[2001:db8::1]:22", "brackets go around a whole IPv6 address"),
    ("gpu-a.lab:22", "a port goes in its own field"),
    ("2001:db8:::1", "neither an IPv6 address nor a host name"),
])
def test_what_is_no_address_says_why(given, words):
    with pytest.raises(ValueError, match=words):
        Address.parse(given)


def test_loopback_link_local_and_global():
    assert Address.parse("::1").is_loopback and Address.parse("127.0.0.2").is_loopback
    assert Address.parse("localhost").is_loopback and Address.parse("ip6-localhost").is_loopback
    assert not Address.parse("2001:db8::1").is_loopback
    assert Address.parse("fe80::1").needs_zone and Address.parse("fe80::1%eth0").needs_zone
    assert not Address.parse("169.254.1.1").needs_zone      # IPv4 link-local needs no zone
    assert Address.parse("2606:4700::1111").is_global and Address.parse("1.1.1.1").is_global
    for private in ("2001:db8::1", "fd00::5", "10.0.0.5", "::1", "gpu-a.lab"):
        assert not Address.parse(private).is_global, private


def test_one_address_however_written_has_one_key():
    assert Address.parse("2001:DB8:0::1").key == Address.parse("[2001:db8::1]").key
    assert Address.parse("GPU-A.lab").key == Address.parse("gpu-a.lab").key


def inventory(text):
    return parse_inventory(text, "hosts.yaml", environ={})


def test_inventory_addresses_lose_their_brackets_and_keep_their_port():
    a, b = inventory("defaults: {ssh_config: none}\nhosts:\n"
                     "  - {name: a, address: '[2001:db8::1]', port: 2601}\n"
                     "  - {name: b, address: 2001:db8::2, cluster_address: '[2001:db8::3]'}\n"
                     ).hosts
    assert (a.address, a.ssh.hostname, a.ssh.port) == ("2001:db8::1", "2001:db8::1", 2601)
    assert a.ssh.shown() == "[2001:db8::1]:2601"
    assert (b.cluster_address, str(b.tf_address)) == ("2001:db8::3", "2001:db8::3")
    assert a.label == "a (2001:db8::1)"


def test_bracketed_and_bare_forms_of_one_machine_collide_like_one_address():
    text = ("defaults: {ssh_config: none}\nhosts:\n"
            "  - {name: a, address: '[2001:db8::1]'}\n  - {name: b, address: 2001:DB8::1}\n")
    with pytest.raises(InventoryError, match="same machine and workdir as host 'a'"):
        inventory(text)


def test_ssh_config_hostname_v6_is_the_login_and_the_cluster_address(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host v6a\n    HostName ::1\n    Port 2601\n"
                      "Host v6b\n    HostName [2001:db8::7]\n")
    a, b = inventory(f"defaults: {{ssh_config: {config}}}\nhosts:\n"
                     "  - {name: a, address: v6a}\n  - {name: b, address: v6b}\n").hosts
    assert (a.ssh.hostname, a.ssh.port, a.tf_address.with_port(5000)) == ("::1", 2601,
                                                                          "[::1]:5000")
    assert b.ssh.hostname == "2001:db8::7" and a.label == "a (v6a = ::1)"


def test_v6_gateways_parse_and_print_in_brackets():
    assert parse_hops("admin@[2001:db8::1]:2200,[::1]") == [
        ("admin", "2001:db8::1", 2200), (None, "::1", None)]
    assert Hop("gw", "2001:db8::1", 2200, "admin").shown() == "admin@[2001:db8::1]:2200"
    with pytest.raises(SshConfigError, match="is not a gateway"):
        parse_hops("[:::1]:22")
