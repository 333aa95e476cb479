"""Lints for setups that would hang TensorFlow instead of failing."""
from __future__ import annotations

from pathlib import Path

from deploy.inventory.load import parse_inventory
from deploy.plan.lints import lint

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
