"""`train`: one run from inventory to summary, with teardown whatever happens.

Order matters for "bad input changes nothing anywhere": everything that can be checked locally
(inventory, payload, args) is checked before any host is touched, and once anything has been
written to a host, every way out goes through teardown.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from .inventory import Inventory
from .planner import Options, RunPlan, plan_run
from .plantext import plan_document
from .progress import TaskProgress, losses_agree
from .push import PayloadPush
from .follow import Followers
from .session import Session, StepFailed
from .view import LiveView, failure_panel, say, summary_table

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class RunSettings:
    runs_dir: Path = Path("runs")
    connect_timeout: float = 10.0
    accept_new_host_keys: bool = False
    # A worker whose peer never comes waits for an hour and ignores SIGTERM: without this
    # watchdog a missing or blocked peer is a silent hang.
    start_timeout: float = 120.0


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class Run:
    """The state of one run on the controller: its plan, its tasks' progress, its local files."""

    def __init__(self, plan: RunPlan, session: Session, local_dir: Path, console: Console):
        self.plan, self.session, self.dir, self.console = plan, session, local_dir, console
        self.tasks = [TaskProgress(t.index, t.host.name) for t in plan.tasks]
        self.logs = {t.index: open(local_dir / f"{t.name}.log", "ab") for t in plan.tasks}
        self.failure: tuple[TaskProgress, str] | None = None
        self.problems: list[str] = []

    def watch(self, start_timeout: float) -> None:
        """Stream every task's log until all have ended; on the first failure stop the rest."""
        followers = Followers(self.plan, self.session.transports)
        by_index = {t.index: t for t in self.tasks}
        hosts = {hp.host.name: [by_index[t.index] for t in hp.tasks] for hp in self.plan.hosts}
        followers.start_all(self.offsets())
        deadline = time.monotonic() + start_timeout if start_timeout > 0 else 0.0
        try:
            with LiveView(self.console, self.tasks, f"run {self.plan.run_id}") as view:
                while not all(t.finished for t in self.tasks):
                    if deadline and time.monotonic() > deadline:
                        self._check_started(start_timeout)
                        deadline = 0.0
                    event = followers.next(timeout=0.25)
                    if event is None:
                        view.refresh()
                        continue
                    if event.kind == "doc":
                        for index, doc in event.doc["tasks"].items():
                            self._apply(by_index[int(index)], doc, view)
                    elif not all(t.finished for t in hosts[event.host]):
                        # The stream broke (or ended early): follow again from where we are.
                        if event.error:
                            say(self.console, f"following {event.host}: {event.error}", "yellow")
                        if not followers.restart(event.host, self.offsets()):
                            raise StepFailed(f"{event.host}: lost contact while following the "
                                             f"run: {event.error or 'stream ended'}")
                    view.refresh()
        finally:
            followers.close()

    def _check_started(self, start_timeout: float) -> None:
        """Fail the run if some task never reached its first training step.
        Only a payload that prints events is watched: of another one we cannot tell."""
        if not any(t.speaks_events for t in self.tasks):
            return
        stuck = [t for t in self.tasks if not t.first_step and t.state not in ("exited", "lost")]
        if stuck and self.failure is None:
            names = ", ".join(f"{t.name} ({t.host})" for t in stuck)
            for task in stuck:
                self.console.print(failure_panel(task, "no training step yet"))
            self.failure = (stuck[0], f"startup watchdog: {names} did not reach a first "
                                      f"training step within {start_timeout:g} s")
            say(self.console, self.failure[1] + " — stopping the run", "red")
            self.problems += self.session.stop(self.plan).values()

    def offsets(self) -> dict[int, int]:
        return {t.index: t.offset for t in self.tasks}

    def _apply(self, task: TaskProgress, doc: dict, view: LiveView) -> None:
        data, lines = task.update(doc)
        self.logs[task.index].write(data)
        view.lines(task, lines)
        if task.finished and task.failed and self.failure is None:
            self._fail(task)

    def _fail(self, task: TaskProgress) -> None:
        reason = (f"exit code {task.code}" if task.state == "exited"
                  else "its process group vanished without an exit code")
        self.failure = (task, reason)
        self.console.print(failure_panel(task, reason))
        say(self.console, f"{task.name} failed: stopping the other tasks", "red")
        self.problems += self.session.stop(self.plan).values()

    def close_logs(self) -> None:
        for log in self.logs.values():
            log.close()


def train(inventory: Inventory, options: Options, settings: RunSettings,
          console: Console) -> int:
    run_id = new_run_id()
    payload = PayloadPush(Path(options.payload), options.entry, run_id,
                          hash_cache=settings.runs_dir / "payload-hashes.json")
    skeleton = plan_run(inventory, options, run_id)
    local_dir = settings.runs_dir / run_id
    count = len(skeleton.tasks)
    console.print(f"run [bold]{run_id}[/]: {count} task(s) on {len(inventory.hosts)} host(s); "
                  f"local records in {local_dir}", highlight=False)
    with console.status(f"connecting to {len(inventory.hosts)} host(s)…"):
        session = Session.open(inventory, settings.connect_timeout, settings.accept_new_host_keys)
    local_dir.mkdir(parents=True, exist_ok=True)
    run: Run | None = None
    plan = skeleton
    interrupted = False
    started = time.monotonic()
    try:
        _write_json(local_dir / "push.json", payload.send(session, skeleton, console))
        with console.status("choosing ports…"):
            plan = plan_run(inventory, options, run_id, session.free_ports(skeleton))
        _write_json(local_dir / "plan.json", plan_document(plan))
        run = Run(plan, session, local_dir, console)
        with console.status(f"starting {count} task(s)…"):
            session.launch(plan)
        console.print(f"started {count} task(s) in {time.monotonic() - started:.1f} s; "
                      "cluster " + ", ".join(t.endpoint for t in plan.tasks), highlight=False)
        run.watch(settings.start_timeout)
    except KeyboardInterrupt:
        interrupted = True
        say(console, "interrupted: stopping every task of the run…", "yellow")
    finally:
        code = _finish(plan, session, run, local_dir, console, interrupted)
    return code


def _finish(plan: RunPlan, session: Session, run: Run | None, local_dir: Path,
            console: Console, interrupted: bool) -> int:
    """Fetch what the run made, tear it down everywhere, write the summary. Runs on every exit
    path after the first push, including Ctrl-C and errors."""
    problems: list[str] = list(run.problems) if run else []
    artifacts = 0
    # A second Ctrl-C must not cut teardown short and leave tasks behind; every remote step
    # here has its own timeout, so ignoring it cannot hang the controller forever.
    restore = _ignore_sigint()
    try:
        with console.status("stopping tasks and fetching results…"):
            if run and not interrupted:
                try:
                    artifacts = session.fetch_output(plan, local_dir / "artifacts")
                except Exception as exc:  # reported; teardown still runs
                    problems.append(f"fetching artifacts: {exc}")
            if run and interrupted:
                _drain_logs(run)
            problems += session.cleanup(plan).values()
    finally:
        session.close()
        if run:
            run.close_logs()
        restore()
    code = _exit_code(run, interrupted, problems)
    if run:
        console.print(summary_table(run.tasks))
        _write_json(local_dir / "summary.json", _summary(plan, run, artifacts, problems, code,
                                                         interrupted))
    for problem in problems:
        say(console, f"teardown: {problem}", "bold red")
    if not problems:
        say(console, f"teardown: no process of run {plan.run_id} left; run directories "
                     f"removed on {len(plan.hosts)} host(s)", "green")
    if artifacts:
        console.print(f"artifacts: {artifacts} file(s) in {local_dir / 'artifacts'}",
                      highlight=False)
    return code


def _ignore_sigint():
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    return lambda: signal.signal(signal.SIGINT, previous)


def _drain_logs(run: Run) -> None:
    """After a stop, read what the tasks wrote last, so the local logs are complete."""
    try:
        answers, _ = run.session.poll(run.plan, {t.index: t.offset for t in run.tasks})
        for task in run.tasks:
            if task.index in answers:
                data, _ = task.update(answers[task.index])
                run.logs[task.index].write(data)
    except Exception:  # best effort: the run is being torn down anyway
        pass


def _exit_code(run: Run | None, interrupted: bool, problems: list[str]) -> int:
    if interrupted:
        return EXIT_INTERRUPTED
    if run is None or problems or run.failure:
        return 1
    return 0 if all(t.state == "exited" and t.code == 0 for t in run.tasks) else 1


def _summary(plan: RunPlan, run: Run, artifacts: int, problems: list[str], code: int,
             interrupted: bool) -> dict:
    return {
        "run_id": plan.run_id,
        "exit_code": code,
        "interrupted": interrupted,
        "failure": None if not run.failure else {
            "task": run.failure[0].name, "reason": run.failure[1]},
        "losses_agree": losses_agree(run.tasks),
        "artifact_files": artifacts,
        "teardown_problems": problems,
        "tasks": [{
            "task": t.name, "host": t.host, "state": t.state, "exit_code": t.code,
            "duration_s": None if t.duration is None else round(t.duration, 3),
            "epochs": t.epoch, "final_loss": t.loss, "losses": t.losses,
        } for t in run.tasks],
    }


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)
