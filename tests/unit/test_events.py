"""What a run reports (deploy/state/events.py) and its two reporters (deploy/console/reporter.py):
every event is plain values that JSON writes as one line; the console shows each as the lines
and tables people read; orchestration (deploy/run/) prints nothing itself."""
from __future__ import annotations

import ast
import io
import json
from pathlib import Path

from rich.console import Console

from deploy.console.reporter import ConsoleReporter, JsonReporter
from deploy.host.records import replace
from deploy.state import events as ev
from deploy.state.progress import NewLines

ROOT = Path(__file__).resolve().parents[2]


def summary(problems=()) -> ev.RunSummary:
    snap = ev.TaskSnapshot(0, "worker-0", "h1", 41, "exited", 0, 12.5, 3, 3, 0.7084,
                           {"accuracy": 0.718}, None, None, (1.0, 0.74, 0.7084))
    return ev.RunSummary("r1", 0, (snap, replace(snap, index=1, name="worker-1")),
                         16.3, True, tuple(problems), 2, "runs/r1/summary.json", 6,
                         "runs/r1/artifacts", "runs/r1/loss.png", "runs/r1/tensorboard")


def samples() -> list[ev.Event]:
    """One event of every kind a run or a check emits with plain fields."""
    return [
        ev.RunPlanned("r1", 2, 1), ev.HostsChecked(2, 0.4), ev.RecordsAt("runs/r1"),
        ev.GpusPlaced((("h1", (0, 2)),)), ev.PayloadLeftOut(("runs/",)),
        ev.Pushed("payload: 1 of 4 file(s) changed (1 B) → 1 of 1 host(s)"),
        ev.TasksStarted(2, 0.1, ("127.0.0.1:1", "127.0.0.1:2")),
        ev.TaskOutput("worker-0", 0, "h1", 3, NewLines(b"a\n\x1b[2Jb\n"), False),
        ev.TaskProgressed("worker-0", "h1", "running", 1, 3, 1.0, {"accuracy": 0.5}),
        ev.TaskLastLines("worker-1", "h2", "exit code 1", ("Traceback",)),
        ev.TaskEnded("worker-0", "h1", "exit code 0", "run_done"),
        ev.RunFailing("worker-1 failed: stopping the other tasks"),
        ev.HostLost("h2", "h2 (10.0.0.2): no heartbeat for 10 s", True),
        ev.FollowResumed("h2", "stream ended"), ev.Interrupted(False),
        ev.StoppedUnstarted("r1", ""), ev.Detached("r1", 2, "", ""), ev.FollowStopped("r1", ""),
        ev.RestartRefused("no restarts left (1 allowed): ending the run"),
        ev.Restarting(1, 2, "worker-1", "exit code 1"), ev.PortLost("port 5 on h1 was taken"),
        ev.AttemptStarted(2, ("127.0.0.1:3",), 2048, 1),
        ev.ArchiveNote("h1: skipped 'x' of the output: a link"),
        ev.PlotFailed("runs/r1/loss.png", "no space"), summary(),
        ev.TeardownAbandoned("tasks may still run on h1", "inv down --run r1"),
        ev.RunNote("r1", "run r1 has ended"), ev.HostPruned("h1", True, {"cached file(s)": (2, 10)}),
        ev.PruneDone(True),
    ]


def test_every_event_is_one_json_line_named_by_its_kind():
    out = io.StringIO()
    reporter = JsonReporter(out)
    events = samples()
    for event in events:
        reporter.emit(event)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(events)
    docs = [json.loads(line) for line in lines]
    assert [d["event"] for d in docs] == [e.kind() for e in events]
    assert docs[0] == {"event": "run_planned", "run_id": "r1", "tasks": 2, "hosts": 1}
    output = next(d for d in docs if d["event"] == "task_output")
    assert output["lines"] == ["a", "\x1b[2Jb"] and "\x1b" not in lines[5]   # escaped
    (last,) = [d for d in docs if d["event"] == "run_summary"]
    assert last["losses_agree"] is True and last["exit_code"] == 0
    assert [t["name"] for t in last["tasks"]] == ["worker-0", "worker-1"]


def test_every_event_kind_is_unique_and_every_event_says_something():
    kinds = [cls.kind() for cls in vars(ev).values()
             if isinstance(cls, type) and issubclass(cls, ev.Event) and cls is not ev.Event]
    assert len(kinds) == len(set(kinds))
    for event in samples():
        assert event.text(), event


def shown(*events: ev.Event) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    reporter = ConsoleReporter(console)
    for event in events:
        reporter.emit(event)
    return console.file.getvalue()


def test_the_console_shows_the_lines_people_read():
    text = shown(ev.RunPlanned("r1", 2, 1), ev.HostLost("h2", "h2 (10.0.0.2): silent", True),
                 ev.TaskEnded("worker-1", "b", "exit code 1", "goes_on"))
    assert text.splitlines() == [
        "run r1: 2 task(s) on 1 host(s)",
        "h2 (10.0.0.2): silent: the host is lost — stopping the other tasks",
        "worker-1 (b) ended (exit code 1); the run goes on without it"]


def test_the_console_shows_a_summary_as_its_table_then_teardown_then_the_paths():
    text = shown(summary())
    lines = [line.rstrip() for line in text.splitlines()]
    assert lines[0] == "summary" and any("worker-1" in line for line in lines)
    assert "wall time 16.3 s   losses agree: yes" in text
    tail = lines[-5:]
    assert tail == ["teardown: no process of run r1 left; run directories removed on 2 host(s)",
                    "artifacts:   6 file(s) in runs/r1/artifacts",
                    "loss curve:  runs/r1/loss.png", "summary:     runs/r1/summary.json",
                    "TensorBoard: tensorboard --logdir runs/r1/tensorboard"]
    assert "teardown: h2: survivors 5" in shown(summary(["h2: survivors 5"]))


def test_task_output_is_shown_prefixed_and_inert():
    text = shown(ev.TaskOutput("worker-0", 0, "h1", None, NewLines(b"\x1b]52;c;eA==\x07hi\n")))
    assert text == "[worker-0 h1] \\x1b]52;c;eA==\\x07hi\n"


def test_orchestration_prints_nothing_itself():
    """deploy/run/ reports events (deploy/state/events.py); only reporters print."""
    calls = []
    for path in sorted((ROOT / "deploy" / "run").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else \
                    getattr(node.func, "id", "")
                if name in ("print", "say", "print_lines"):
                    calls.append(f"{path.name}:{node.lineno} {name}")
    assert calls == []


def test_a_run_let_go_for_a_closed_stdout_is_told_on_stderr_by_both_reporters(capsys):
    """stdout's reader is gone (`inv train | head`): how to follow the run again, or that it
    is torn down before its tasks started, goes to stderr too, from the console reporter and
    the JSON one alike; otherwise stderr is quiet."""
    quiet = (ev.StoppedUnstarted("r1", "the terminal closed: "), ev.Detached("r1", 2, "", ""),
             ev.FollowStopped("r1", ""))
    told = (ev.Detached("r1", 2, "the output's reader is gone (a closed pipe): ", "",
                        stdout_closed=True), ev.FollowStopped("r1", "", stdout_closed=True),
            ev.StoppedUnstarted("r2", "the output's reader is gone (a closed pipe): ", True))
    for reporter in (ConsoleReporter(Console(file=io.StringIO(), width=200)),
                     JsonReporter(io.StringIO())):
        for event in quiet:
            reporter.emit(event)
        assert capsys.readouterr().err == ""
        for event in told:
            reporter.emit(event)
        err = capsys.readouterr().err
        assert "run r1 is running detached on 2 host(s)" in err
        assert "inv logs --run r1 --follow" in err
        assert "stopped following; run r1 goes on" in err
        assert "no task of run r2 had started: tearing down what it set up" in err
