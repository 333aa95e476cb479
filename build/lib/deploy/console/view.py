"""What the user sees: prefixed live log lines, a status table, the end-of-run summary."""
from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from deploy.state.progress import TaskProgress, losses_agree
from deploy.state.record import RunRecord, RunState

COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow")
STATE_STYLES = {"pending": "dim", "running": "yellow", "exited": "green", "lost": "red"}


def say(console: Console, message: str, style: str = "") -> None:
    """Print a message that may contain brackets (addresses, lists) without rich markup."""
    console.print(Text(message, style=style))


def task_style(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def prefixed(task: TaskProgress, line: str) -> Text:
    text = Text(f"[{task.name} {task.host}] ", style=task_style(task.index))
    text.append(line)
    return text


def print_lines(console: Console, task: TaskProgress, lines: list[str]) -> None:
    for line in lines:
        console.print(prefixed(task, line), markup=False, highlight=False, soft_wrap=True)


def state_text(task: TaskProgress) -> Text:
    if task.state == "exited":
        return Text(f"exit {task.code}", style="green" if task.code == 0 else "bold red")
    return Text(task.state, style=STATE_STYLES.get(task.state, ""))


def status_table(tasks: list[TaskProgress], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    for column in ("task", "host", "pid", "state", "epoch", "loss", "metrics"):
        table.add_column(column)
    for t in tasks:
        metrics = "  ".join(f"{k}={v:.4g}" for k, v in t.metrics.items() if k != "loss")
        table.add_row(Text(t.name, style=task_style(t.index)), t.host,
                      str(t.pid or ""), state_text(t), "" if t.epoch is None else str(t.epoch),
                      "" if t.loss is None else f"{t.loss:.6g}", metrics)
    return table


class LiveView:
    """Log lines scroll above; the status table stays at the bottom of the terminal."""

    def __init__(self, console: Console, tasks: list[TaskProgress], title: str):
        self.console, self.tasks, self.title = console, tasks, title
        self.live = Live(self._render(), console=console, refresh_per_second=4,
                         transient=True, redirect_stdout=False, redirect_stderr=False)

    def _render(self):
        return status_table(self.tasks, self.title)

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live.is_started:
            self.live.stop()

    def lines(self, task: TaskProgress, lines: list[str]) -> None:
        print_lines(self.console, task, lines)

    def refresh(self) -> None:
        if self.live.is_started:
            self.live.update(self._render())


def summary_table(tasks: list[TaskProgress]) -> Table:
    agree = losses_agree(tasks)
    verdict = {True: Text("yes", style="green"), False: Text("NO", style="bold red"),
               None: Text("-", style="dim")}[agree]
    table = Table(title="summary", title_justify="left")
    for column in ("task", "host", "exit", "duration", "final loss", "losses agree"):
        table.add_column(column)
    for t in tasks:
        duration = "" if t.duration is None else f"{t.duration:.1f} s"
        table.add_row(Text(t.name, style=task_style(t.index)), t.host, state_text(t), duration,
                      "" if t.loss is None else f"{t.loss:.6g}", verdict)
    return table


def failure_panel(task: TaskProgress, reason: str) -> Panel:
    body = Text("\n".join(task.tail[-20:]) or "(no output)")
    return Panel(body, title=f"{task.name} on {task.host}: {reason} — last log lines",
                 border_style="red", title_align="left")


RUN_STATE_STYLES = {RunState.RUNNING: "yellow", RunState.DETACHED: "cyan",
                    RunState.STARTING: "yellow", RunState.FINISHED: "green",
                    RunState.INTERRUPTED: "magenta", RunState.DOWN: "dim"}


def runs_table(records: list[RunRecord], title: str) -> Table:
    """One row per local run record (deploy/state/record.py)."""
    table = Table(title=title, title_justify="left")
    for column in ("run", "started", "hosts", "tasks", "state"):
        # Ids and times are what a user copies: never wrapped or cut.
        table.add_column(column, no_wrap=column in ("run", "started", "state"))
    for record in records:
        state = record.shown_state()
        style = RUN_STATE_STYLES[record.state]
        if record.state is RunState.FINISHED and record.exit_code != 0:
            style = "bold red"
        if record.attempt > 1:
            state += f", attempt {record.attempt}"
        table.add_row(record.run_id, record.started_text(),
                      ", ".join(h.name for h in record.hosts),
                      str(len(record.tasks)), Text(state, style=style))
    return table
