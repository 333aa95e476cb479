"""`inv train` in a terminal, as a person sees it: the controller runs on a pseudo-terminal of
150x45 with the default local inventory and real TensorFlow, and everything it wrote to the
terminal is read back."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import fcntl
import time
from pathlib import Path

import pytest
from matplotlib.image import imread

from deploy.console.lines import is_tensorflow_chatter
from procs import wait_until_gone

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
# A TensorFlow C++ log prefix anywhere in the output (also after a task's prefix).
CPP_ANYWHERE = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]")


def run_on_terminal(args: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run `python -m invoke ARGS` on a new pseudo-terminal of 150x45; its exit status and
    every byte it wrote to the terminal, escape sequences removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 45, 150, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:         # EIO: the controller closed the terminal
                break
            if not data:
                break
            out += data
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, ANSI.sub("", out.decode("utf-8", "replace"))


def test_a_terminal_shows_the_table_and_the_summary_but_no_tensorflow_chatter(tmp_path):
    runs = tmp_path / "runs"
    code, screen = run_on_terminal(["train", "--runs-dir", str(runs),
                                    "--args", "--epochs 3 --steps-per-epoch 5"])
    assert code == 0, screen
    run_dir = next(p for p in runs.iterdir() if p.is_dir())
    # Nothing TensorFlow's C++ runtime wrote and no raw event reached the terminal...
    assert not CPP_ANYWHERE.search(screen), screen
    assert "absl::InitializeLog" not in screen and '"event"' not in screen, screen
    # ...while the local logs keep both.
    for i in range(2):
        log = (run_dir / f"worker-{i}.log").read_text().splitlines()
        assert any(is_tensorflow_chatter(line) for line in log)
        assert any('"event": "epoch"' in line for line in log)
    # The live table was drawn: its header, and a row per task with epochs of the total.
    assert "steps/s" in screen and "loss curve" in screen and "epochs" in screen
    for i in range(2):
        assert re.search(rf"│ worker-{i} +│ local +│ \d+ +│ running +│ [123]/3 ", screen), screen
    # The summary: each task's final loss on its own row, the files the run left.
    summary = json.loads((run_dir / "summary.json").read_text())
    for i, task in enumerate(summary["tasks"]):
        row = rf"│ worker-{i} +│ local +│ exit 0 +│ [\d.]+ s +│ 3/3 +│ {task['final_loss']:.4f} +│"
        assert re.search(row, screen), screen
    assert f"loss curve:  {run_dir / 'loss.png'}" in screen
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in screen
    assert any((run_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    image = imread(run_dir / "loss.png")
    assert image.shape[0] >= 150 and image.shape[1] >= 200
    assert (image[..., :3] < 0.95).any(axis=-1).mean() > 0.01
    assert wait_until_gone(run_dir.name, timeout=5) == []

    # `inv plot` draws it again from the local logs; plain `inv logs` prints them raw.
    (run_dir / "loss.png").unlink()
    code, screen = run_on_terminal(["plot", "--runs-dir", str(runs)])
    assert code == 0 and imread(run_dir / "loss.png").shape[1] >= 200, screen
    code, screen = run_on_terminal(["logs", "--runs-dir", str(runs)])
    assert code == 0 and '"event": "epoch"' in screen, screen
