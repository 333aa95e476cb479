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


def drawn(count: int, height: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=150, height=height, force_terminal=True,
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
