"""What people see: the line filter, the live table's content, the summary and loss.png."""
from __future__ import annotations

import io
import json

import pytest
from matplotlib.image import imread
from rich.console import Console

from deploy.console.flood import LineBudget
from deploy.console.lines import epoch_text, is_tensorflow_chatter, shown_line
from deploy.console.plot import plot_losses
from deploy.console.reporter import ConsoleReporter
from deploy.console.view import (
    LiveView, failure_panel, print_lines, run_progress, sparkline, status_table, summary_table
)
from deploy.errors import Failure
from deploy.run.reattach import plot as plot_run
from deploy.host.protocol import TaskStatus
from deploy.state.progress import NewLines, TaskProgress
from deploy.state.record import RunState
from test_records import lab_plan, recorded

# Lines as a TensorFlow 2.21 worker writes them on a machine without a GPU.
CHATTER = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796281974.746382    1198 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors.",
    "I0000 00:00:1796281974.746762    1198 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1796281985.447890    1443 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "W1203 07:12:54.123456   31399 collective_ops.cc:42] a warning once absl is set up",
    "F1203 07:12:54.1   7 some_file.h:9] fatal",
]
# The payload's own output (and Python-level warnings): kept.
PAYLOAD = [
    "crashing on purpose",
    "WARNING:tensorflow:From train.py:10: a deprecation",
    "I0000 is not a log prefix without the rest",
    "Traceback (most recent call last):",
    "  File \"train.py\", line 350, in <module>",
    "",
]
EVENTS = [
    json.dumps({"event": "start", "task": 0, "workers": 2, "epochs": 30, "steps_per_epoch": 30}),
    json.dumps({"event": "first_step", "task": 0}),
    json.dumps({"event": "epoch", "task": 0, "epoch": 1, "loss": 1.3322207927703857,
                "accuracy": 0.375, "seconds": 4.2}),
]


def epoch(n, loss, seconds=0.5, **metrics):
    return json.dumps({"event": "epoch", "task": 0, "epoch": n, "loss": loss,
                       "seconds": seconds, **metrics})


def task_with(lines, index=0, host="local", **status):
    task = TaskProgress(index, host)
    task.replay(("\n".join(lines) + "\n").encode())
    for key, value in status.items():
        setattr(task, key, value)
    return task


def new_lines(lines) -> NewLines:
    return NewLines(("\n".join(lines) + "\n").encode())


def rendered(renderable, width=150) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_tensorflow_chatter_is_recognised_and_payload_output_is_not():
    assert [line for line in CHATTER if not is_tensorflow_chatter(line)] == []
    assert [line for line in PAYLOAD if is_tensorflow_chatter(line)] == []


def test_the_default_view_hides_chatter_and_events_and_raw_shows_everything():
    lines = CHATTER + PAYLOAD + EVENTS
    shown = [shown_line(line, events_as_text=False) for line in lines]
    assert [s for s in shown if s is not None] == PAYLOAD
    assert [shown_line(line, raw=True) for line in lines] == lines


def test_without_a_table_an_epoch_event_becomes_a_short_line():
    assert shown_line(EVENTS[2], epochs_total=30) == "epoch 1/30  loss 1.3322  accuracy 0.3750"
    assert shown_line(EVENTS[2]) == "epoch 1  loss 1.3322  accuracy 0.3750"
    assert shown_line(EVENTS[0]) is None and shown_line(EVENTS[1]) is None
    assert epoch_text({"event": "epoch", "epoch": 2, "loss": 2.5e-07, "flag": True}) == \
        "epoch 2  loss 2.500e-07"


def test_printed_lines_carry_the_task_prefix_and_no_chatter():
    out = io.StringIO()
    console = Console(file=out, width=150, color_system=None)
    task = task_with(EVENTS[:1])
    print_lines(console, task, CHATTER + ["training data ready"] + EVENTS)
    assert out.getvalue() == ("[worker-0 local] training data ready\n"
                              "[worker-0 local] epoch 1/30  loss 1.3322  accuracy 0.3750\n")


def test_the_live_view_without_a_terminal_prints_plain_lines():
    out = io.StringIO()
    console = Console(file=out, width=150, color_system=None)
    task = task_with(EVENTS[:1])
    with LiveView(console, [task], "run x") as view:
        assert not view.live.is_started
        view.lines(task, new_lines(CHATTER + EVENTS))
        view.refresh()
    assert out.getvalue() == "[worker-0 local] epoch 1/30  loss 1.3322  accuracy 0.3750\n"


def test_the_live_view_on_a_terminal_leaves_events_to_its_table():
    out = io.StringIO()
    console = Console(file=out, width=150, force_terminal=True, color_system=None)
    task = task_with(EVENTS)
    with LiveView(console, [task], "run x") as view:
        assert view.live.is_started
        view.lines(task, new_lines(CHATTER + ["hello from the payload"] + EVENTS))
        view.refresh()
        view.live.refresh()         # draw now rather than at the next tick
    text = out.getvalue()
    assert "hello from the payload" in text
    assert '"event"' not in text and "cuda" not in text and "epoch 1/30" not in text
    assert "worker-0" in text and "1/30" in text    # the table drawn on the terminal


def test_progress_reports_speed_eta_and_validation_losses():
    # The first epoch pays the cluster's start-up: no estimate from it alone.
    assert task_with([EVENTS[0], epoch(1, 2.0, seconds=4.0)]).eta_seconds is None
    task = task_with([EVENTS[0], epoch(1, 2.0, seconds=4.0), epoch(2, 1.0, val_loss=1.5),
                      epoch(3, 0.5, seconds=1.0, val_loss=0.75, accuracy=0.9)])
    assert (task.epochs_total, task.steps_per_epoch, task.epoch) == (30, 30, 3)
    assert task.losses == [2.0, 1.0, 0.5] and task.val_losses == [1.5, 0.75]
    assert task.metrics == {"loss": 0.5, "val_loss": 0.75, "accuracy": 0.9}
    assert task.steps_per_second == 30.0
    # 27 epochs left at the mean of the epochs after the first (0.5 s and 1.0 s).
    assert task.eta_seconds == pytest.approx(27 * 0.75)
    task.replay((json.dumps({"event": "resumed", "task": 0, "epoch": 1}) + "\n").encode())
    assert task.losses == [2.0] and task.val_losses == [1.5] and task.epoch_seconds == [4.0]


def test_a_payload_without_totals_gets_no_speed_or_eta():
    task = task_with([epoch(1, 2.0)])
    assert task.steps_per_second is None and task.eta_seconds is None
    assert run_progress([task]) is None
    assert "│ 1     │" in rendered(status_table([task], "run x"))


def test_the_status_table_shows_epoch_of_total_loss_speed_eta_and_curve():
    losses = [1.3322, 1.0303, 0.9447, 0.7093]
    lines = [EVENTS[0]] + [epoch(n, loss, seconds=0.5, accuracy=0.5 + n / 10)
                           for n, loss in enumerate(losses, 1)]
    tasks = [task_with(lines, i, state="running", pid=100 + i) for i in range(2)]
    text = rendered(status_table(tasks, "run 20261203-071833-09c7ec"))
    rows = [line for line in text.splitlines() if "worker-" in line]
    assert len(rows) == 2
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells == [f"worker-{i}", "local", str(100 + i), "running", "4/30", "0.7093",
                         "accuracy 0.9000", "60.0", "0:13", "█▅▄▁"]
    bar = rendered(run_progress(tasks))
    assert "8/60 epochs" in bar and "ETA 0:13" in bar


def test_sparkline_runs_from_the_highest_block_to_the_lowest():
    assert sparkline([4.0, 3.0, 2.0, 1.0]) == "█▆▃▁"
    assert sparkline([1.0, float("nan"), 1.0]) == "▁▁"
    assert sparkline([]) == ""
    assert len(sparkline([float(v) for v in range(100)], width=24)) == 24


def test_the_summary_has_final_losses_metrics_and_wall_time():
    lines = [EVENTS[0], epoch(1, 1.0, accuracy=0.5), epoch(2, 0.3090, accuracy=0.8771)]
    tasks = [task_with(lines, i, state="exited", code=0, started=10.0, ended=40.2)
             for i in range(2)]
    text = rendered(summary_table(tasks, wall_time=30.84))
    rows = [line for line in text.splitlines() if "worker-" in line]
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert cells == [f"worker-{i}", "local", "exit 0", "30.2 s", "2/30", "0.3090",
                         "accuracy 0.8771"]
    assert "wall time 30.8 s" in text and "losses agree: yes" in text


def test_the_failure_panel_shows_the_payloads_last_lines_without_chatter():
    task = task_with(CHATTER + EVENTS + ["crashing on purpose"], index=1)
    text = rendered(failure_panel(task, "exit code 3"))
    assert "crashing on purpose" in text and "cuInit" not in text and '"event"' not in text
    assert "cuInit" in rendered(failure_panel(task, "exit code 3", raw=True))


def decoded(path):
    """The PNG as an array of RGB(A) floats in [0, 1], read back by matplotlib."""
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return imread(path)


def test_the_loss_plot_is_a_real_png_with_every_curve(tmp_path):
    path = tmp_path / "loss.png"
    tasks = [task_with([epoch(n, 2.0 / n, val_loss=2.5 / n) for n in range(1, 11)], i)
             for i in range(2)]
    assert plot_losses(tasks, path, "run x")
    image = decoded(path)
    height, width = image.shape[:2]
    assert width >= 200 and height >= 150
    rgb = image[..., :3]
    not_white = (rgb < 0.95).any(axis=-1)
    assert 0.01 < not_white.mean() < 0.5           # axes, text and curves on a white page
    # The tasks' colours (tab:cyan for worker-0, magenta for worker-1) are on it.
    cyan = (rgb[..., 0] < 0.2) & (rgb[..., 1] > 0.6) & (rgb[..., 2] > 0.7)
    magenta = (rgb[..., 0] > 0.6) & (rgb[..., 1] < 0.2) & (rgb[..., 2] > 0.6)
    assert cyan.sum() > 100 and magenta.sum() > 100


def test_no_losses_no_plot(tmp_path):
    path = tmp_path / "loss.png"
    assert not plot_losses([task_with(["no events here"])], path, "run x")
    assert not path.exists()


def test_inv_plot_redraws_from_the_logs_of_a_run_that_ended_badly(tmp_path):
    plan = lab_plan()
    run_dir = recorded(tmp_path, plan, state=RunState.FINISHED)
    # Task 1 died in its third epoch; task 0 was stopped after its fourth.
    (run_dir / "worker-0.log").write_text(
        "\n".join(CHATTER + [epoch(n, 1.0 / n) for n in range(1, 5)]) + "\n")
    (run_dir / "worker-1.log").write_text(
        "\n".join([epoch(1, 1.0), epoch(2, 0.5), "Traceback (most recent call last):"]))
    console = Console(file=io.StringIO(), width=200)
    assert plot_run(tmp_path, None, ConsoleReporter(console)) == 0
    image = decoded(run_dir / "loss.png")
    assert image.shape[0] >= 150 and image.shape[1] >= 200
    assert console.file.getvalue().strip() == f"loss curve: {run_dir / 'loss.png'}"


def test_inv_plot_says_so_when_no_task_reported_a_loss(tmp_path):
    run_dir = recorded(tmp_path, lab_plan(), state=RunState.FINISHED)
    (run_dir / "worker-0.log").write_text("\n".join(CHATTER) + "\n")
    with pytest.raises(Failure, match="no task reported a loss"):
        plot_run(tmp_path, None, ConsoleReporter(Console(file=io.StringIO())))
    assert not (run_dir / "loss.png").exists()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_flood_prints_samples_with_its_rate_and_every_epoch_line():
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    task = task_with(EVENTS[:1])
    clock = Clock()
    with LiveView(console, [task], "run x") as view:
        view.budget = LineBudget(clock)
        view.lines(task, new_lines(["a readable burst"] * 10))
        for second in range(3):
            flood = [f"line {second}-{i}" for i in range(50_000)]
            log = ("\n".join(flood + [epoch(second + 1, 0.5)]) + "\n").encode()
            new = task.update(TaskStatus("running", size=0, offset=0, data=log))
            view.lines(task, new)
            clock.now += 0.5
            view.refresh()                                  # not due yet: nothing printed
            assert f"line {second}-49999" not in out.getvalue()
            clock.now += 0.5
            view.refresh()
    text = out.getvalue().splitlines()
    assert text[:10] == ["[worker-0 local] a readable burst"] * 10
    assert text[10:] == [line for second in range(3) for line in (
        "[worker-0 local] … 50,001 lines not shown (50,001 lines/s); worker-0.log has every line",
        f"[worker-0 local] line {second}-49998", f"[worker-0 local] line {second}-49999",
        f"[worker-0 local] epoch {second + 1}/30  loss 0.5000")]


def test_after_a_flood_lines_print_whole_again_once_its_rest_is_reported():
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    task = task_with([])
    clock = Clock()
    with LiveView(console, [task], "run x") as view:
        view.budget = LineBudget(clock)
        view.lines(task, new_lines([f"flood {i}" for i in range(5000)]))
        clock.now += 10                                     # a quiet spell: the budget refills
        view.lines(task, new_lines(["calm again"]))
    assert out.getvalue().splitlines() == [
        "[worker-0 local] … 5,000 lines not shown (500 lines/s); worker-0.log has every line",
        "[worker-0 local] flood 4997", "[worker-0 local] flood 4998", "[worker-0 local] flood 4999",
        "[worker-0 local] calm again"]
