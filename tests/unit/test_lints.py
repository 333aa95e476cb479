"""Lints for setups that would hang TensorFlow instead of failing."""
from __future__ import annotations

from pathlib import Path

import pytest

from deploy.inventory.load import parse_inventory
from deploy.plan.lints import LintFailed, lint, public_warnings, refuse_problems

REPO = Path(__file__).resolve().parents[2]


def inventory(text):
    return parse_inventory(text, "lab.yaml", environ={})


def test_loopback_beside_real_hosts_is_refused_and_named():
    inv = inventory("hosts:\n  - {name: here, transport: local}\n"
                    "  - {name: b, address: 10.1.2.4}\n")
    (problem,) = lint(inv, REPO / "payload")
    assert "host 'here'" in problem and "'127.0.0.1' is loopback" in problem
    assert "b cannot reach it" in problem


def test_an_all_loopback_cluster_is_fine():
    inv = inventory("hosts:\n  - {name: a, address: 127.0.0.2}\n"
                    "  - {name: b, address: localhost, workdir: ~/other}\n")
    assert lint(inv, REPO / "payload") == []
    fixed = inventory("hosts:\n  - {name: a, transport: local, cluster_address: 10.1.2.3}\n"
                      "  - {name: b, address: 10.1.2.4}\n")
    assert lint(fixed, REPO / "payload") == []


def test_keras3_payload_is_refused_for_multi_worker_only(tmp_path):
    (tmp_path / "train.py").write_text("import os\nfrom keras import layers\n")
    two = inventory("hosts:\n  - {name: a, transport: local, workers: 2}\n")
    (problem,) = lint(two, tmp_path)
    assert f"{tmp_path / 'train.py'}:2: imports Keras 3" in problem
    one = inventory("hosts:\n  - {name: a, transport: local}\n")
    assert lint(one, tmp_path) == []


def test_the_shipped_payload_passes():
    two = inventory("hosts:\n  - {name: a, transport: local, workers: 2}\n")
    assert lint(two, REPO / "payload") == []


def test_ipv6_loopback_beside_real_hosts_is_refused_and_an_all_loopback_mix_is_fine():
    inv = inventory("hosts:\n  - {name: a, address: '[::1]'}\n"
                    "  - {name: b, address: 2001:db8::4}\n")
    (problem,) = lint(inv, REPO / "payload")
    assert "host 'a'" in problem and "'::1' is loopback" in problem
    mixed = inventory("hosts:\n  - {name: a, address: '::1', port: 2601}\n"
                      "  - {name: b, address: 127.0.0.2}\n")
    assert lint(mixed, REPO / "payload") == []


def test_a_link_local_cluster_address_is_refused_saying_it_needs_a_zone():
    inv = inventory("hosts:\n  - {name: a, address: 'fe80::1%eth0'}\n"
                    "  - {name: b, address: gpu-b.lab, cluster_address: 'fe80::2'}\n")
    problems = lint(inv, REPO / "payload")
    assert len(problems) == 2
    assert "host 'a'" in problems[0] and "'fe80::1%eth0' is IPv6 link-local" in problems[0]
    assert "host 'b'" in problems[1] and "differs from host to host" in problems[1]
    with pytest.raises(LintFailed) as refused:
        refuse_problems(inv, REPO / "payload")
    assert refused.value.exit_code == 2
    # The controller may log in over link-local; the cluster then needs another address.
    fixed = inventory("hosts:\n  - {name: a, address: 'fe80::1%eth0', "
                      "cluster_address: 'fd00::1'}\n  - {name: b, address: 'fd00::2'}\n")
    assert lint(fixed, REPO / "payload") == []


def test_public_cluster_addresses_are_warned_about_in_both_families():
    inv = inventory("hosts:\n  - {name: a, address: 2606:4700::10}\n"
                    "  - {name: b, address: 1.1.1.1}\n"
                    "  - {name: c, address: 2001:db8::4}\n"
                    "  - {name: d, address: fd00::4}\n  - {name: e, address: gpu-e.lab}\n")
    a, b = public_warnings(inv)
    assert "host 'a'" in a and "public IPv6 address" in a and "unauthenticated" in a
    assert "host 'b'" in b and "public IPv4 address" in b
    assert lint(inv, REPO / "payload") == []         # a warning, not a refusal


PS_HOSTS = ("hosts:\n  - {name: c, address: 127.0.0.2, role: chief}\n"
            "  - {name: w, address: 127.0.0.3, workers: 2}\n"
            "  - {name: p, address: 127.0.0.4, role: ps}\n")


@pytest.mark.parametrize("text, host, says", [
    ("hosts:\n  - {name: c, address: 127.0.0.2, role: chief, workers: 2}\n"
     "  - {name: w, address: 127.0.0.3}\n", "c", "2 chief tasks"),
    ("hosts:\n  - {name: c, address: 127.0.0.2, role: chief}\n"
     "  - {name: d, address: 127.0.0.4, role: chief}\n"
     "  - {name: w, address: 127.0.0.3}\n", "d", "2 chief tasks"),
    ("hosts:\n  - {name: p, address: 127.0.0.2, role: ps}\n"
     "  - {name: w, address: 127.0.0.3}\n", "p", "need a chief"),
    ("hosts:\n  - {name: c, address: 127.0.0.2, role: chief}\n"
     "  - {name: p, address: 127.0.0.3, role: ps}\n", "c", "needs worker tasks"),
    (PS_HOSTS + "  - {name: e, address: 127.0.0.5, role: evaluator, workers: 2}\n", "e",
     "at most one evaluator"),
    ("hosts:\n  - {name: w, address: 127.0.0.3}\n"
     "  - {name: e, address: 127.0.0.5, role: evaluator}\n", "e", "give one host role: chief"),
    ("hosts:\n  - {name: s, address: 127.0.0.3, role: spare}\n", "s", "every host is a spare"),
    (PS_HOSTS + "  - {name: s, address: 127.0.0.5, role: spare}\n", "s",
     "a parameter-server cluster cannot take one"),
])
def test_clusters_tensorflow_cannot_run_are_refused_naming_host_and_field(text, host, says):
    (problem,) = lint(inventory(text), REPO / "payload")
    assert problem.startswith(f"lab.yaml: host {host!r}: field 'role': ") and says in problem


def test_a_ps_cluster_with_a_multi_worker_only_payload_is_refused(tmp_path):
    (tmp_path / "main.py").write_text("strategy = tf.distribute.MultiWorkerMirroredStrategy()\n")
    (problem,) = lint(inventory(PS_HOSTS), tmp_path)
    assert "host 'p'" in problem and f"{tmp_path / 'main.py'}:1" in problem
    assert lint(inventory(PS_HOSTS), REPO / "payload") == []   # it names both strategies


def test_an_unknown_role_is_refused_at_load():
    with pytest.raises(Exception) as info:
        inventory("hosts:\n  - {name: a, address: 127.0.0.2, role: boss}\n")
    assert "host 'a': field 'role': must be one of chief, worker, ps, evaluator" in str(info.value)
