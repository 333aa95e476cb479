"""The live view of hundreds of tasks: a row per kind and state where a row per task would
not fit the terminal."""
from __future__ import annotations

import io

from rich.console import Console

from deploy.console.view import LiveView
from deploy.state.progress import TaskProgress


def tasks(count: int) -> list[TaskProgress]:
    made = []
    for i in range(count):
        task = TaskProgress(i, f"h{i}", state="running", epoch=3 + i % 2, loss=1.0 + i % 2)
        made.append(task)
    made[7].state, made[7].code = "exited", 1          # one failed: a row of its own
    return made


def drawn(count: int, height: int, width: int = 150) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, height=height, force_terminal=True,
                      color_system=None)
    with LiveView(console, tasks(count), "run x") as view:
        view.live.refresh()
    return out.getvalue()


def test_hundreds_of_tasks_on_a_small_terminal_are_drawn_a_row_per_kind_and_state():
    shown = drawn(256, 40)
    assert "256 tasks, a row per kind and state" in shown
    assert "255 × worker: worker-0 … worker-255" in shown
    assert "worker-7" in shown and "exit 1" in shown
    assert "3–4" in shown and "mean 1.4980" in shown
    assert "h200" not in shown                     # no row per task
    assert len(shown.splitlines()) < 40


def test_tasks_that_fit_keep_a_row_each():
    shown = drawn(8, 40)
    assert "a row per kind and state" not in shown
    assert all(f"worker-{i}" in shown for i in range(8))


def test_the_groups_figures_stay_whole_in_a_narrow_terminal():
    """The group's name wraps and gives way: from 56 columns on, the hosts, state, epochs and
    loss are whole (the mean's word above its figure at 56), and the table's every line is
    closed by its border (rich's own narrowing had cut them to `runni…`, `mean 1.4…`)."""
    for width in (56, 64, 80, 100):
        shown = drawn(256, 40, width)
        lines = [line for line in shown.splitlines() if line[:1] in ("┏", "┃", "┡", "│", "└")]
        assert lines and all(line.rstrip()[-1] in "┓┃┩│┘" for line in lines), (width, shown)
        assert max(len(line) for line in lines) <= width
        wholes = ("255", "running", "3–4", "1.4980", "exit 1", "worker-255",
                  *(("mean 1.4980",) if width >= 64 else ()))
        for whole in wholes:
            assert any(whole in line for line in lines), (width, whole, shown)
