"""What a newcomer's own project meets: Keras' own output read as epochs (state/progress.py),
tfdeploy's own files never pushed with `--payload .` (push/bundle.py), a missing entry named
with what is there, TensorFlow's continuation lines hidden, the check readable at 80 columns.
Pure: text and files in tmp_path."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from rich.text import Text

from deploy.console.checkview import COLUMNS, HostRows, report_view
from deploy.console.lines import is_tensorflow_chatter
from deploy.host.protocol import Probe
from deploy.inventory.model import Host
from deploy.plan.checks import CheckReport, HostCheck
from deploy.push.bundle import BundleError, checked_payload, left_out_of, payload_files
from deploy.state.progress import TaskProgress, told_epochs

# tf_keras 2.21's model.fit(verbose=2), then verbose=1 (its bar redrawn with \r and \b).
VERBOSE_2 = """Epoch 1/3
16/16 - 0s - loss: 0.7930 - accuracy: 0.4688 - val_loss: 0.7434 - val_accuracy: 0.4219 - 460ms/epoch - 29ms/step
Epoch 2/3
16/16 - 0s - loss: 0.7325 - accuracy: 0.4531 - val_loss: 0.6963 - val_accuracy: 0.5547 - 33ms/epoch - 2ms/step
Epoch 3/3
16/16 - 0s - loss: 0.6912 - accuracy: 0.5469 - val_loss: 0.6801 - val_accuracy: 0.5625 - 35ms/epoch - 2ms/step
"""
VERBOSE_1 = ("Epoch 1/2\n"
             "\r 1/16 [>.....] - ETA: 3s - loss: 0.7151 - accuracy: 0.3438\x08\x08\x08"
             "\r16/16 [======] - 1s 5ms/step - loss: 0.6900 - accuracy: 0.5000\n"
             "Epoch 2/2\n"
             "\r 1/16 [>.....] - ETA: 0s - loss: 0.6500 - accuracy: 0.6000"
             "\r16/16 [======] - 0s 2ms/step - loss: 0.6400 - accuracy: 0.6100 - val_loss: "
             "0.6300 - val_accuracy: 0.6200\n")


def fed(text: str, pieces: int = 1) -> TaskProgress:
    task = TaskProgress(0, "local")
    data = text.encode()
    step = max(1, len(data) // pieces)
    for at in range(0, len(data), step):
        task.replay(data[at:at + step])
    return task


def test_keras_verbose_2_gives_epochs_losses_and_metrics():
    for pieces in (1, 7, 50):                  # however the log arrives in chunks
        task = fed(VERBOSE_2, pieces)
        assert (task.epoch, task.epochs_total, task.steps_per_epoch) == (3, 3, 16)
        assert task.losses == [0.793, 0.7325, 0.6912] and task.val_losses == [0.7434, 0.6963,
                                                                              0.6801]
        assert task.metrics == {"loss": 0.6912, "accuracy": 0.5469, "val_loss": 0.6801,
                                "val_accuracy": 0.5625}
        assert task.epoch_seconds == [0.46, 0.033, 0.035] and task.eta_seconds == 0
        assert told_epochs([task])


def test_keras_verbose_1_reads_the_last_redraw_of_each_epoch():
    task = fed(VERBOSE_1)
    assert task.losses == [0.69, 0.64] and task.epoch == 2 and task.val_losses == [0.63]
    assert task.epoch_seconds == [16 * 0.005, 16 * 0.002]


def test_event_lines_win_over_keras_output():
    events = "\n".join(json.dumps(e) for e in (
        {"event": "start", "epochs": 3},
        {"event": "epoch", "epoch": 1, "loss": 9.0}))
    task = fed(VERBOSE_2.split("Epoch 2/3")[0] + events + "\n" + VERBOSE_2)
    assert task.losses == [9.0] and task.epochs_total == 3 and task.speaks_events


def test_a_script_that_prints_no_epochs_is_told_apart():
    task = fed("hello\nloss: not a number line\n16/16 - 0s - loss: 0.5\n")
    assert task.losses == [] and not told_epochs([task])


def test_tfdeploys_own_files_stay_home(tmp_path):
    (tmp_path / "fit.py").write_text("print(1)\n")
    (tmp_path / ".tfdeployignore").write_text("*.tmp\n")
    (tmp_path / "runs" / "20261204-1").mkdir(parents=True)
    (tmp_path / "runs" / "20261204-1" / "worker-0.log").write_text("x\n")
    (tmp_path / ".tfdeploy-cache").mkdir()
    (tmp_path / ".tfdeploy-cache" / "f").write_text("x\n")
    left = left_out_of(tmp_path, tmp_path / "runs")
    assert [p.name for p in left] == [".tfdeploy-cache", "runs"]
    files = [f.as_posix() for f in checked_payload(tmp_path, "fit.py", tmp_path / "runs")]
    assert files == [".tfdeployignore", "fit.py"]
    # A runs directory elsewhere leaves a payload's own `runs/` alone: it is the user's.
    assert "runs/20261204-1/worker-0.log" in [
        f.as_posix() for f in payload_files(tmp_path, left_out=left_out_of(tmp_path, None))]


def test_a_missing_entry_names_the_flag_and_the_scripts_there(tmp_path):
    for name in ("fit.py", "prepare.py"):
        (tmp_path / name).write_text("\n")
    with pytest.raises(BundleError) as refused:
        checked_payload(tmp_path, "train.py")
    assert str(refused.value) == (f"entry script 'train.py' not found in payload {tmp_path} "
                                  f"(its scripts: fit.py, prepare.py): name the script to run "
                                  f"with --entry")


def test_tensorflows_continuation_lines_are_chatter():
    assert is_tensorflow_chatter("/job:worker/replica:0/task:1")
    assert is_tensorflow_chatter("/job:worker/replica:0/task:0/device:CPU:0")
    assert not is_tensorflow_chatter("/job:worker is what I called my job")


def test_the_check_at_80_columns_keeps_every_cell_whole():
    hosts = []
    for n in range(2):
        check = HostCheck(Host(name=f"gpu-server-{n}", address=f"10.20.30.{n}"))
        check.probe = Probe("3.11.2", "/usr/bin/python3", {"tensorflow": "2.21.0",
                                                           "tf_keras": "2.21.0",
                                                           "numpy": "2.4.6"},
                            "/", 75 << 30, True, (40001, 40002), True)
        hosts.append(check)
    console = Console(file=io.StringIO(), width=80, record=True, color_system=None)
    console.print(report_view(CheckReport(hosts)))
    text = console.export_text()
    assert "gpu-server-0\n  address: 10.20.30.0\n  python: 3.11.2" in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    wide = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    wide.print(report_view(CheckReport(hosts)))
    assert "│ gpu-server-0 │ 10.20.30.0 │ 3.11.2 │" in wide.export_text()


def test_the_check_at_any_width_is_a_whole_table_or_blocks_never_a_cropped_table():
    """Within a few cells of fitting, rich's own narrowing cropped the table's right edge
    (the problems column's border, at 98-100 columns for one local host): now every width
    from 40 to 200 shows either the table with each line closed by its border, or blocks."""
    def row(host, address, ports, mesh="ok", problems="ok"):
        return [Text(v) for v in (host, address, "3.11.7", "2.21.0", "2.21.0", "2.4.6",
                                  "77.6 GiB", ports, mesh, problems)]
    hosts = [row("local", "local", "49011, 57223"),
             row("gpu-node-17", "10.1.2.17", ", ".join(str(40000 + i) for i in range(8)),
                 "#1, #2", "#3, #4, #5")]
    kinds = set()
    for width in range(40, 201):
        console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
        console.print(HostRows("check", hosts))
        lines = console.export_text().splitlines()
        assert max(len(line) for line in lines) <= width
        shown = " ".join(lines)
        assert all(word in shown for cells in hosts for cell in cells
                   for word in cell.plain.split()), (width, lines)
        if lines[1].startswith("┏"):
            kinds.add("table")
            assert all(line[-1] in "┓┃┩│┘" for line in lines[1:]), (width, lines)
            assert all(column in shown for column in COLUMNS), (width, lines)
        else:
            kinds.add("blocks")
            assert "  problems: #3, #4, #5" in lines, (width, lines)
    assert kinds == {"table", "blocks"}


def test_a_logs_last_lines_are_read_from_its_end(tmp_path):
    """`logs --tail N`: the last N lines the console would show, read backwards in pieces
    (a piece of 8 bytes here, so that lines span pieces), chatter skipped unless raw."""
    from deploy.run.reattach import last_shown
    log = tmp_path / "worker-0.log"
    lines = [f"line {n}" for n in range(50)]
    lines[47] = "I0000 00:00:1796281974.746382  1198 port.cc:153] oneDNN custom operations"
    log.write_text("\n".join(lines) + "\n")
    assert last_shown(log, 3, raw=False, piece=8) == [b"line 46\n", b"line 48\n", b"line 49\n"]
    assert last_shown(log, 3, raw=True, piece=8)[0].startswith(b"I0000")
    assert len(last_shown(log, 500, raw=True, piece=8)) == 50
    assert last_shown(log, 0, raw=True) == []
    cut = tmp_path / "cut.log"
    cut.write_text("first\nsecond\nno newline yet")
    assert last_shown(cut, 2, raw=True, piece=4) == [b"second\n", b"no newline yet\n"]
    assert last_shown(log, 2, raw=True, most=16) == [b"line 48\n", b"line 49\n"]
