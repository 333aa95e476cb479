"""What the user sees: prefixed live log lines, a status table, the end-of-run summary."""
from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from deploy.console.flood import SAMPLE_LINES, LineBudget, Skipped, skipped_text
from deploy.console.lines import number, shown_line
from deploy.console.plain import plain
from deploy.console.widths import fitted_widths, table_of
from deploy.state.events import RunListed, TaskLastLines
from deploy.state.progress import NewLines, TaskProgress, losses_agree
from deploy.state.record import RunState

COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow")
STATE_STYLES = {"pending": "dim", "running": "yellow", "exited": "green", "lost": "red"}


def say(console: Console, message: str, style: str = "", soft_wrap: bool = False) -> None:
    """Print a message that may contain brackets (addresses, lists) or a host's words as plain
    text (plain.py); `soft_wrap` leaves long lines to the terminal (paths stay whole for
    copying)."""
    console.print(Text(plain(message), style=style), soft_wrap=soft_wrap)


def task_style(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def prefixed(task: TaskProgress, line: str) -> Text:
    text = Text(f"[{task.name} {task.host}] ", style=task_style(task.index))
    text.append(line)
    return text


def print_lines(console: Console, task: TaskProgress, lines: list[str], raw: bool = False,
                events_as_text: bool = True) -> None:
    """Print a task's log lines as lines.py decides: by default without TensorFlow's C++ log
    and with epoch events as short readable lines (`events_as_text`) or not at all. One print
    for them all: each print makes a live display redraw itself."""
    texts = [prefixed(task, shown) for line in lines
             if (shown := shown_line(line, raw, events_as_text, task.epochs_total)) is not None]
    if texts:
        console.print(Text("\n").join(texts), markup=False, highlight=False, soft_wrap=True)


def state_text(task: TaskProgress) -> Text:
    """The task's state as its host said it (checked against its enum where it arrived, and
    shown as plain text all the same)."""
    if task.state == "exited":
        return Text(plain(f"exit {task.code}"), style="green" if task.code == 0 else "bold red")
    return Text(plain(str(task.state)), style=STATE_STYLES.get(task.state, ""))


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 24) -> str:
    """The last `width` values as block characters, lowest ▁ to highest █."""
    values = [v for v in values[-width:] if v == v]      # NaN has no height
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        return SPARKS[0] * len(values)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round((v - low) / (high - low) * top)] for v in values)


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def epoch_of(task: TaskProgress) -> Text:
    """The epoch the payload last reported (of its total), as plain text: it is the
    payload's value, whatever it holds."""
    if task.epoch is None:
        return Text("")
    return Text(plain(f"{task.epoch}/{task.epochs_total}" if task.epochs_total
                      else str(task.epoch)))


def metrics_text(task: TaskProgress) -> Text:
    """The last metrics but the loss, named as the payload names them (plain text)."""
    return Text(plain("  ".join(f"{k} {number(v)}" for k, v in task.metrics.items()
                                if k != "loss")))


def gpu_text(task: TaskProgress, peak: bool = False) -> str:
    """`1  87%  20480 MiB`: the task's GPU and, as last sampled, its utilisation and memory
    (or the peak of its memory: the summary's)."""
    if task.gpu is None:
        return ""
    if peak:
        return task.gpu + ("" if task.gpu_memory_peak is None else
                           f"  peak {task.gpu_memory_peak} MiB")
    use = "" if task.gpu_utilization is None else f"  {task.gpu_utilization}%"
    memory = "" if task.gpu_memory is None else f"  {task.gpu_memory} MiB"
    return task.gpu + use + memory


def status_table(tasks: list[TaskProgress], title: str) -> Table:
    """One row per task: where it runs, its state, how far training is and how it goes; its
    GPU where it has one."""
    table = Table(title=title, title_justify="left", expand=False)
    gpus = any(t.gpu is not None for t in tasks)
    for column in ("task", "host", "pid", "state", *(("GPU",) if gpus else ()), "epoch",
                   "loss", "metrics", "steps/s", "ETA", "loss curve"):
        table.add_column(column, no_wrap=column in ("task", "epoch", "loss", "loss curve"))
    for t in tasks:
        speed = t.steps_per_second
        table.add_row(Text(t.name, style=task_style(t.index)), t.host,
                      Text(plain(str(t.pid or ""))), state_text(t),
                      *((gpu_text(t),) if gpus else ()), epoch_of(t),
                      "" if t.loss is None else number(t.loss), metrics_text(t),
                      "" if speed is None else f"{speed:.1f}",
                      duration_text(t.eta_seconds) if t.state == "running" else "",
                      Text(sparkline(t.losses), style=task_style(t.index)))
    return table


GROUPED_COLUMNS = ("tasks", "hosts", "state", "epoch", "loss", "ETA")


def grouped_table(tasks: list[TaskProgress], title: str, width: int) -> Table:
    """The status table when a row per task would not fit the terminal (hundreds of hosts):
    a row per task type and state, with how many tasks and hosts are in it, how far they are
    and how they go. A failed or lost task stands in a row of its own state. The columns are
    fitted to the terminal's `width` (widths.py): the group's name wraps so that the figures
    beside it stay whole."""
    groups: dict[tuple[str, str], list[TaskProgress]] = {}
    for t in tasks:
        groups.setdefault((t.role, state_text(t).plain), []).append(t)
    rows = []
    for (role, state), members in groups.items():
        epochs = [t.epoch for t in members if t.epoch is not None]
        losses = [t.loss for t in members if t.loss is not None]
        etas = [t.eta_seconds for t in members if t.eta_seconds is not None]
        names = members[0].name if len(members) == 1 else \
            f"{len(members)} × {role}: {members[0].name} … {members[-1].name}"
        rows.append([Text(names), Text(str(len({t.host for t in members}))),
                     state_text(members[0]),
                     Text("" if not epochs else (f"{min(epochs)}" if min(epochs) == max(epochs)
                                                 else f"{min(epochs)}–{max(epochs)}")),
                     Text("" if not losses else number(losses[0]) if len(losses) == 1
                          else f"mean {number(sum(losses) / len(losses))}"),
                     Text(duration_text(max(etas)) if etas and state == "running" else "")])
    wrapping = ("tasks", "loss")
    return table_of(f"{title} ({len(tasks)} tasks, a row per kind and state)", GROUPED_COLUMNS,
                    wrapping, rows, fitted_widths(GROUPED_COLUMNS, wrapping, rows, width))


def run_progress(tasks: list[TaskProgress]) -> Table | None:
    """The run's progress bar: epochs done of all tasks' epochs, once every task has said how
    many it trains."""
    if not tasks or any(t.epochs_total is None for t in tasks):
        return None
    total = sum(t.epochs_total for t in tasks)
    done = sum(min(t.epoch or 0, t.epochs_total) for t in tasks)
    etas = [t.eta_seconds for t in tasks if t.state == "running" and t.eta_seconds is not None]
    line = Table.grid(padding=(0, 1))
    line.add_row("run", ProgressBar(total=total, completed=done, width=40),
                 f"{done}/{total} epochs", f"ETA {duration_text(max(etas))}" if etas else "")
    return line


# The terminal lines a status table needs besides its rows (title, header, borders, the
# progress bar), and a few for the log lines scrolling above it.
ROOM = 12


class LiveView:
    """Log lines scroll above; the status table and the run's progress bar stay at the bottom
    of the terminal, redrawn at most REFRESH times a second. Without a terminal there is no
    table: epoch events print as short lines instead (lines.py). Lines print as fast as a
    person reads them; a flood prints as samples with its rate (flood.py)."""

    REFRESH = 4

    def __init__(self, console: Console, tasks: list[TaskProgress], title: str,
                 raw: bool = False):
        self.console, self.tasks, self.title, self.raw = console, tasks, title, raw
        self.by_index = {t.index: t for t in tasks}
        self.budget = LineBudget()
        self.drawn = 0.0
        self.live = Live(self._render(), console=console, refresh_per_second=self.REFRESH,
                         transient=True, redirect_stdout=False, redirect_stderr=False)

    def _render(self):
        bar = run_progress(self.tasks)
        # A row per task while they fit with room left for the lines scrolling above.
        fits = len(self.tasks) + ROOM <= self.console.size.height
        table = (status_table(self.tasks, self.title) if fits else
                 grouped_table(self.tasks, self.title, self.console.width))
        return table if bar is None else Group(table, bar)

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        for index, skipped in self.budget.due(everything=True):
            self._report(self.by_index[index], skipped)
        if self.live.is_started:
            self.live.stop()

    def lines(self, task: TaskProgress, new: NewLines) -> None:
        count = new.count
        if not count:
            return
        if not self.budget.admit(count):
            self.budget.skip(task.index, count, new.last_lines(SAMPLE_LINES), new.events)
            return
        self._report(task, self.budget.take(task.index))
        self._print(task, new.all())

    def _print(self, task: TaskProgress, lines: list[str]) -> None:
        print_lines(self.console, task, lines, self.raw, events_as_text=not self.live.is_started)

    def _report(self, task: TaskProgress, skipped: Skipped | None) -> None:
        """What a flooded stretch of `task` left out: how much and how fast, its events and
        its latest lines."""
        if skipped is None:
            return
        note = skipped_text(skipped, self.budget.clock(), f"{task.name}.log")
        self.console.print(prefixed(task, note), markup=False, highlight=False, soft_wrap=True)
        self._print(task, [e for e in skipped.events if e not in skipped.latest] + skipped.latest)

    def refresh(self) -> None:
        for index, skipped in self.budget.due():
            self._report(self.by_index[index], skipped)
        now = time.monotonic()
        if self.live.is_started and now - self.drawn >= 1 / self.REFRESH:
            self.live.update(self._render())
            self.drawn = now


def summary_table(tasks: list[TaskProgress], wall_time: float | None = None) -> Table:
    """One row per task: how it ended, its final loss and metrics; below it the run's wall
    time and whether every task saw the same losses (synchronous training)."""
    agree = losses_agree(tasks)
    verdict = {True: "[green]yes[/]", False: "[bold red]NO[/]", None: "[dim]-[/]"}[agree]
    caption = f"losses agree: {verdict}"
    if wall_time is not None:
        caption = f"wall time {wall_time:.1f} s   " + caption
    table = Table(title="summary", title_justify="left", caption=caption,
                  caption_justify="left")
    gpus = any(t.gpu is not None for t in tasks)
    for column in ("task", "host", "exit", "duration", *(("GPU",) if gpus else ()), "epochs",
                   "final loss", "metrics"):
        table.add_column(column, no_wrap=column != "metrics")
    for t in tasks:
        duration = "" if t.duration is None else f"{t.duration:.1f} s"
        table.add_row(Text(t.name, style=task_style(t.index)), t.host, state_text(t), duration,
                      *((gpu_text(t, peak=True),) if gpus else ()), epoch_of(t),
                      "" if t.loss is None else number(t.loss), metrics_text(t))
    return table


def failure_panel(task: TaskProgress, reason: str, raw: bool = False) -> Panel:
    """The task's last lines, filtered as the console filters them (lines.py)."""
    return failure_panel_of(TaskLastLines(task.name, task.host, reason, tuple(task.tail), raw))


def failure_panel_of(event: TaskLastLines) -> Panel:
    tail = [shown for line in event.lines
            if (shown := shown_line(line, event.raw, events_as_text=False)) is not None]
    body = Text("\n".join(tail[-20:]) or "(no output)")
    # A title given as a string would be read as markup.
    return Panel(body, title=Text(plain(event.text())), border_style="red",
                 title_align="left")


RUN_STATE_STYLES = {RunState.RUNNING.value: "yellow", RunState.DETACHED.value: "cyan",
                    RunState.STARTING.value: "yellow", RunState.FINISHED.value: "green",
                    RunState.INTERRUPTED.value: "magenta", RunState.DOWN.value: "dim"}


def runs_table(runs: tuple[RunListed, ...], title: str) -> Table:
    """One row per local run record (deploy/state/record.py)."""
    table = Table(title=title, title_justify="left")
    for column in ("run", "started", "hosts", "tasks", "state"):
        # Ids and times are what a user copies: never wrapped or cut.
        table.add_column(column, no_wrap=column in ("run", "started", "state"))
    for run in runs:
        state = run.state
        style = RUN_STATE_STYLES[run.style_state]
        if run.style_state == RunState.FINISHED.value and run.exit_code != 0:
            style = "bold red"
        if run.attempt > 1:
            state += f", attempt {run.attempt}"
        table.add_row(run.run_id, run.started, ", ".join(run.hosts), str(run.tasks),
                      Text(state, style=style))
    return table
