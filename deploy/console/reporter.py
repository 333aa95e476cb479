"""The two reporters of a run's events (deploy/state/events.py): the console, for people (the
live view, tables, panels and plain lines, as rich draws them), and JSON lines, for scripts and
CI (`--json`: one object per line on stdout, nothing else there).

Orchestration asks a reporter for three things: `emit(event)`; `status(text)`, a spinner while
a step runs; and `watching(tasks, title, raw)` / `setup_progress(progress)`, the live displays
of a run and of `inv setup`. The JSON reporter shows no spinner and no live display: its stream
is events.
"""
from __future__ import annotations

import contextlib
import json
import sys
from typing import Callable, Iterator

from rich.console import Console
from rich.live import Live

from deploy.console.checkview import report_view
from deploy.console.setupview import progress_table, versions_table
from deploy.console.view import (
    LiveView, failure_panel_of, print_lines, runs_table, say, status_table, summary_table
)
from deploy.state import events as ev
from deploy.state.envprogress import HostProgress
from deploy.state.progress import TaskProgress

STYLES = {ev.INFO: "", ev.NOTE: "dim", ev.WARNING: "yellow", ev.ERROR: "bold red",
          ev.GOOD: "green"}


class ConsoleReporter:
    def __init__(self, console: Console):
        self.console = console
        self.view: LiveView | None = None     # the run's live view while it is watched

    def status(self, text: str):
        return self.console.status(text)

    @contextlib.contextmanager
    def watching(self, tasks: list[TaskProgress], title: str, raw: bool) -> Iterator[None]:
        """The run's live view (a status table and a progress bar below the scrolling log
        lines) while its tasks are followed."""
        with LiveView(self.console, tasks, title, raw) as view:
            self.view = view
            try:
                yield
            finally:
                self.view = None

    def refresh(self) -> None:
        if self.view is not None:
            self.view.refresh()

    @contextlib.contextmanager
    def setup_progress(self, progress: dict[str, HostProgress]) -> Iterator[Callable[[], None]]:
        """inv setup's live rows, one per host, redrawn by calling what it yields."""
        with Live(progress_table(progress), console=self.console, refresh_per_second=4,
                  transient=True) as shown:
            yield lambda: shown.update(progress_table(progress))

    def emit(self, event: ev.Event) -> None:
        show = SHOWN.get(type(event))
        if show is not None:
            show(self, event)
        elif event.text():
            # Paths and commands in them are for copying: never wrapped.
            say(self.console, event.text(), STYLES[event.level],
                soft_wrap=isinstance(event, ev.TeardownAbandoned))
        tell_stderr_too(event)


def tell_stderr_too(event: ev.Event) -> None:
    """An event that says what became of a run because stdout's reader is gone (`inv train |
    head`; its `stdout_closed`) goes to stderr as well, which is often still the user's
    terminal."""
    if getattr(event, "stdout_closed", False):
        say(Console(stderr=True, highlight=False), event.text(), STYLES[event.level],
            soft_wrap=True)


def _task_output(reporter: ConsoleReporter, event: ev.TaskOutput) -> None:
    if reporter.view is not None:
        reporter.view.lines(event, event.new)
    else:
        print_lines(reporter.console, event, event.new.all(), event.raw)


def _print(render: Callable[[ev.Event], object]) -> Callable[[ConsoleReporter, ev.Event], None]:
    return lambda reporter, event: reporter.console.print(render(event))


def _run_summary(reporter: ConsoleReporter, event: ev.RunSummary) -> None:
    console = reporter.console
    console.print(summary_table(event.tasks, event.wall_time))
    for line in event.teardown_lines():
        say(console, line, "bold red" if event.teardown_problems else "green")
    for line in event.file_lines():          # paths and commands, for copying: never wrapped
        say(console, line, soft_wrap=True)
    if event.hint:
        say(console, f"note: {event.hint}", "yellow")


def _setup_done(reporter: ConsoleReporter, event: ev.SetupDone) -> None:
    console = reporter.console
    console.print(versions_table(event.hosts))
    say(console, event.text())
    for host in event.hosts:
        if host.state == "failed":
            say(console, f"{host.name}: {host.line}", "bold red")
            for line in host.tail[-10:]:
                say(console, f"  {line}", "dim")
    for name, problem in event.cleanup_problems.items():
        say(console, f"cleanup on {name}: {problem}", "bold red")


def _runs_listed(reporter: ConsoleReporter, event: ev.RunsListed) -> None:
    if event.runs:
        reporter.console.print(runs_table(event.runs, event.text()))
    else:
        say(reporter.console, event.text())


# Events shown otherwise than as their line of text.
SHOWN: dict[type, Callable[[ConsoleReporter, ev.Event], None]] = {
    ev.TaskOutput: _task_output,
    ev.TaskProgressed: lambda reporter, event: None,      # the live table shows it
    ev.TaskLastLines: _print(failure_panel_of),
    ev.CheckReported: _print(lambda event: report_view(event.report)),
    ev.RunSummary: _run_summary,
    ev.RunStatus: _print(lambda event: status_table(event.tasks, event.title)),
    ev.RunsListed: _runs_listed,
    ev.SetupDone: _setup_done,
}


class QuietReporter:
    """A reporter whose events alone tell what happens: no spinner and no live display (a
    script reading JSON lines, or a log file, has no use for them). Subclasses emit."""

    def status(self, text: str):
        return _NoStatus()

    @contextlib.contextmanager
    def watching(self, tasks: list[TaskProgress], title: str, raw: bool) -> Iterator[None]:
        yield

    def refresh(self) -> None:
        pass

    @contextlib.contextmanager
    def setup_progress(self, progress: dict[str, HostProgress]) -> Iterator[Callable[[], None]]:
        yield lambda: None

    def emit(self, event: ev.Event) -> None:
        raise NotImplementedError


class ControllerLogReporter(QuietReporter):
    """The background controller's (run/background.py): its events as lines in its log,
    without the tasks' output (their own logs hold it), spinners or live view (no one
    watches a file)."""

    def __init__(self, console: Console):
        self.console = ConsoleReporter(console)

    def emit(self, event: ev.Event) -> None:
        if not isinstance(event, (ev.TaskOutput, ev.TaskProgressed)):
            self.console.emit(event)
        self.console.console.file.flush()


class JsonReporter(QuietReporter):
    """One JSON object per event on stdout, flushed as it is written: a script reads the run as
    it goes. Host text is carried as it came; JSON escapes every control character."""

    def __init__(self, out=None):
        self.out = out

    def emit(self, event: ev.Event) -> None:
        # sys.stdout as it is now: while a command runs, the one that outlives its terminal
        # and its pipe's reader (deploy/run/signals.py HangupProof).
        out = self.out or sys.stdout
        out.write(json.dumps(event.as_json(), separators=(",", ":")) + "\n")
        out.flush()
        tell_stderr_too(event)


class _NoStatus(contextlib.nullcontext):
    """A step's status where none is shown: its updates go nowhere."""

    def __enter__(self):
        return self

    def update(self, text: str) -> None:
        pass
