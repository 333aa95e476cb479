"""A newcomer's first hour, as one would have it: a project directory of their own, outside
this checkout, with an ordinary Keras script (`fit.py`: `model.fit(..., verbose=2)`, no event
lines) and the installed `tfdeploy` command, on the built-in inventory (two local workers)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from deploy.console.lines import is_tensorflow_chatter
from procs import wait_until_gone

TFDEPLOY = Path(sys.executable).parent / "tfdeploy"
FIT = """\
import numpy as np
import tensorflow as tf

x = np.random.default_rng(0).random((640, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int32")
model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=5, batch_size=32, verbose=2, validation_split=0.2)
"""


def tfdeploy(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    assert TFDEPLOY.is_file(), f"{TFDEPLOY} missing: install the project (pip install -e .)"
    return subprocess.run([str(TFDEPLOY), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "fit.py").write_text(FIT)
    (tmp_path / "README.md").write_text("my project\n")
    return tmp_path


def runs_of(project: Path) -> list[Path]:
    return sorted(p for p in (project / "runs").iterdir() if p.is_dir())


def test_a_plain_keras_script_from_its_own_directory(project):
    """Run twice with `--payload .`: the second push is the script's files alone (never the
    runs directory beside them); Keras' own lines give epochs, losses and loss.png."""
    for _ in range(2):
        done = tfdeploy(project, "train", "--payload", ".", "--entry", "fit.py")
        assert done.returncode == 0, done.stdout + done.stderr
    first, second = runs_of(project)
    # Of the project's files, README.md and fit.py: the first run's records are not sent.
    assert re.search(r"payload: 0 of 2 file\(s\) changed", flat(done.stdout)), done.stdout
    assert "payload: left out runs/" in flat(done.stdout)
    summary = json.loads((second / "summary.json").read_text())
    for task in summary["tasks"]:
        assert task["epochs"] == 5 and task["epochs_total"] == 5 and len(task["losses"]) == 5
        assert task["final_loss"] == task["losses"][-1] and "val_loss" in task["metrics"]
    assert (second / "loss.png").stat().st_size > 0
    # `logs` shows what `train` showed: no TensorFlow C++ log line, Keras' lines kept.
    shown = tfdeploy(project, "logs", "--run", second.name)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Epoch 5/5" in shown.stdout

    def chatter(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if is_tensorflow_chatter(line.split("] ", 1)[-1])]
    assert chatter(shown.stdout) == []
    raw = tfdeploy(project, "logs", "--run", second.name, "--verbose")
    assert chatter(raw.stdout), "TensorFlow printed no C++ log line: nothing was filtered"


def test_hints_and_help_name_tfdeploy(project):
    detached = tfdeploy(project, "train", "--payload", ".", "--entry", "fit.py", "--detach")
    assert detached.returncode == 0, detached.stdout + detached.stderr
    assert "tfdeploy logs --run" in detached.stdout and "inv " not in detached.stdout
    (run_dir,) = runs_of(project)
    followed = tfdeploy(project, "logs", "--run", run_dir.name, "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert wait_until_gone(run_dir.name, timeout=5) == []
    helped = tfdeploy(project, "train", "--help")
    assert "`tfdeploy down`" in helped.stdout and "`inv " not in helped.stdout
    assert "--grace=SECONDS" in helped.stdout and "=STRING" not in helped.stdout
    core = tfdeploy(project, "--help")
    assert "--prompt-for-sudo-password" not in core.stdout and "--dry" not in core.stdout
    assert "-h" in core.stdout and "--help" in core.stdout


@pytest.mark.parametrize("args, words", [
    (("train", "--epochs", "3"),
     'tfdeploy train has no flag --epochs; for the payload\'s own flags: --args "--epochs 3"'),
    (("trian",), "no task or flag 'trian'; did you mean train?"),
    (("train", "--hots", "x.yaml"), "tfdeploy train has no flag --hots; did you mean --hosts?"),
    (("logs", "-t", "worker-1"), "tfdeploy logs has no flag -t"),
])
def test_a_mistyped_command_line_is_bad_input_with_what_was_meant(project, args, words):
    done = tfdeploy(project, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in flat(done.stderr), done.stderr
    assert "Traceback" not in done.stderr and not (project / "runs").exists()


def test_without_entry_the_scripts_there_are_named(project):
    done = tfdeploy(project, "train", "--payload", ".")
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("entry script 'train.py' not found in payload . (its scripts: fit.py): name the "
            "script to run with --entry") in flat(done.stdout)


def test_a_port_that_speaks_http_is_one_line_naming_the_host(project):
    class Answer(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        (project / "web.yaml").write_text(
            f"hosts:\n  - {{name: web, address: 127.0.0.1, port: {port}}}\n")
        done = tfdeploy(project, "check", "--hosts", "web.yaml")
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "Traceback" not in out and "Exception (client)" not in out, out
    assert f"web (127.0.0.1): port {port} speaks no SSH: got " in flat(out), out
