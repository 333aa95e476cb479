"""A dry run refuses what the real run refuses, before any host: the payload, its entry, the
ignore file, local data, the runs directory and the lints. The real run here is pointed at
an SSH port where nothing listens (127.0.0.1:9): a check it skipped would end in a connection
failure (exit 1), not in the BadInput (exit 2) these tests expect."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from deploy.console.reporter import ConsoleReporter
from deploy.errors import BadInput
from deploy.inventory.load import load_inventory
from deploy.plan.planner import Options
from deploy.run.launch import train
from deploy.run.preflight import refuse_bad_input
from deploy.run.run import RunSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lab(tmp_path):
    payload = tmp_path / "payload"
    (payload / "pkg").mkdir(parents=True)
    (payload / "train.py").write_text("print('hi')\n")
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "part-0").write_text("0\n")
    (tmp_path / "afile").write_text("not a directory\n")
    return tmp_path


def inventory(lab: Path, data: str = ""):
    path = lab / "hosts.yaml"
    path.write_text("hosts:\n  - {name: nowhere, address: 127.0.0.1, port: 9, workdir: "
                    f"/tmp/tfdeploy-never{', data: {local: ' + data + '}' if data else ''}}}\n")
    return load_inventory(path, {})


CASES = {
    # name: (change to the lab, options, runs dir, data dir, words of the message)
    "no payload": (None, {"payload": "missing"}, "runs", "", ["payload directory", "missing",
                                                               "does not exist"]),
    "payload is a file": (None, {"payload": "afile"}, "runs", "", ["afile is a file"]),
    "no entry": (None, {"entry": "main.py"}, "runs", "", ["'main.py' not found"]),
    "entry outside": (None, {"entry": "../../../etc/passwd"}, "runs", "", ["outside the payload"]),
    "entry absolute": (None, {"entry": "/etc/passwd"}, "runs", "", ["relative to the payload"]),
    "entry is a directory": (None, {"entry": "pkg"}, "runs", "", ["a directory, not a script"]),
    "entry ignored": ("train.py\n", {}, "runs", "", ["excluded by", ".tfdeployignore"]),
    "reversed range": ("*.log\n[z-a]\n", {}, "runs", "", [".tfdeployignore:2", "reversed"]),
    "ignore not utf-8": (b"ok\n\xff\n", {}, "runs", "", [".tfdeployignore:2", "not UTF-8"]),
    "runs dir a file": (None, {}, "afile", "", ["runs directory", "afile", "not a directory"]),
    "runs dir under a file": (None, {}, "afile/runs", "", ["cannot be created", "afile"]),
    "data symlink out": ("LINK", {}, "runs", "shards", ["hosts.yaml", "'nowhere'", "'data'",
                                                       "symlink points outside"]),
    "keras 3 import": ("KERAS", {}, "runs", "", ["imports Keras 3"]),
}


def arrange(lab: Path, change) -> None:
    if change == "LINK":
        (lab / "shards" / "out").symlink_to(lab / "afile")
    elif change == "KERAS":
        (lab / "payload" / "model.py").write_text("import keras\n")
    elif isinstance(change, bytes):
        (lab / "payload" / ".tfdeployignore").write_bytes(change)
    elif change:
        (lab / "payload" / ".tfdeployignore").write_text(change)


@pytest.mark.parametrize("case", CASES)
def test_the_dry_run_and_the_real_run_refuse_alike_before_any_host(lab, case, monkeypatch):
    change, given, runs, data, words = CASES[case]
    monkeypatch.chdir(lab)
    arrange(lab, change)
    chosen = inventory(lab, data)
    if case == "keras 3 import":         # Keras 3 only matters with two tasks or more
        chosen = load_inventory(_two_workers(lab), {})
    options = Options(**{"payload": "payload", **given})
    with pytest.raises(BadInput) as dry:
        refuse_bad_input(chosen, options, Path(runs))
    with pytest.raises(BadInput) as real:
        train(chosen, options, RunSettings(runs_dir=Path(runs), connect_timeout=2),
              ConsoleReporter(Console(file=open(os.devnull, "w"))))
    assert str(dry.value) == str(real.value)
    for word in words:
        assert word in str(dry.value)
    assert sorted(p.name for p in lab.iterdir()) == sorted(
        ["payload", "shards", "afile", "hosts.yaml"])      # nothing written here


def _two_workers(lab: Path) -> Path:
    path = lab / "hosts.yaml"
    path.write_text("hosts:\n  - {name: nowhere, address: 127.0.0.1, port: 9, workers: 2, "
                    "workdir: /tmp/tfdeploy-never}\n")
    return path


def test_a_good_payload_passes(lab):
    refuse_bad_input(inventory(lab, str(lab / "shards")), Options(payload=str(lab / "payload")),
                     lab / "runs")
    assert not (lab / "runs").exists()


@pytest.mark.parametrize("flags, words", [
    (["--runs-dir", "afile"], ["not a directory"]),
    (["--entry", "../../../etc/passwd"], ["outside the payload"]),
])
def test_through_the_command_line_the_dry_run_says_what_the_run_says(lab, flags, words):
    (lab / "hosts.yaml").write_text(
        "hosts:\n  - {name: nowhere, address: 127.0.0.1, port: 9, workdir: /tmp/tfdeploy-x}\n")
    answers = []
    for dry in (["--dry-run"], []):
        done = subprocess.run(
            [sys.executable, "-m", "invoke", "-r", str(REPO), "train", "--hosts", "hosts.yaml",
             "--payload", "payload", "--connect-timeout", "2", *flags, *dry],
            cwd=lab, capture_output=True, text=True, timeout=120,
            env={**os.environ, "COLUMNS": "300"})
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert all(w in done.stdout for w in words), done.stdout
        answers.append(done.stdout)
    assert answers[0] == answers[1]
