"""`inv train --detach --restarts N`: the run's controller goes on in the background.

`inv train` checks, pushes and launches in the foreground as always (bad input and failed
checks are seen where they were typed), then hands the launched run to a controller of its
own: this module run as a program (`python -m deploy.run.background`), in a session of its
own, with no terminal (stdin from /dev/null once it has read the hosts' env values from it,
which a relaunch needs and the record never holds; its output in runs/<id>/controller.log),
so that a closed terminal does not reach it. It follows the run as `inv logs --follow` does,
but with `--restarts` (watch.py, restarts.py), and ends it (finish.py): the record then says how.

It lives on this machine: shutting it down or suspending it stops the supervision, not the
tasks (they go on, unsupervised, for a later `inv logs --follow` or `inv down`).

The hand-over leaves no moment without a controller: the new one inherits the follow lock
(the same open file, so the lock is never free in between) and `inv train` returns only once
it has connected to every host and written its pid into the record; until then `inv train`
keeps the run, and follows it itself when the hand-over fails.

`inv logs --follow` of such a run watches it without following the hosts itself: the local
logs the background controller writes, and its log's lines (restarts, recoveries, the end),
until it ends; its exit status is then the run's. `inv down` stops the background controller
first (SIGTERM: it lets the run go, as a follower does), then the run.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

import deploy.commandline as commandline
from deploy.console.reporter import ControllerLogReporter
from deploy.errors import TfdeployError
from deploy.host.archive import Limits
from deploy.inventory.model import EnvValue, Inventory
from deploy.cluster.session import Session
from deploy.run.finish import Finish, finish, runs_dir_flag
from deploy.run.lostport import NewPorts
from deploy.run.restarts import Restarter
from deploy.run.run import READ_PIECE, Run, RunSettings, load_local_logs
from deploy.run.signals import HungUp, controller_signals, exit_code
from deploy.run.watch import follow_to_end
from deploy.state import localdir
from deploy.state.events import (
    ControllerOutput, FollowStopped, Reporter, RunFailing, RunNote, Supervised
)
from deploy.state.localdir import private_umask
from deploy.state.record import FollowLock, RECORD_FILE, RecordError, RunRecord, RunState, \
    load_record

MODULE = "deploy.run.background"
# How long `inv train` waits for the background controller to connect and take the run.
START_WAIT = 60.0
# How long `inv down` waits for it to let the run go before it is killed.
STOP_WAIT = 30.0
POLL = 0.25


# --- inv train: the hand-over ------------------------------------------------------------

def hand_over(run: Run, settings: RunSettings, lock: FollowLock) -> bool:
    """Start the background controller of the launched `run` and wait until it has taken the
    run over; then let the run go here (True). False when it did not start: the run is still
    this controller's, which follows it instead (what went wrong is in its log)."""
    local_dir = run.dir
    log_path = local_dir / localdir.CONTROLLER_LOG
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    lock_fd = lock.file.fileno()
    try:
        process = subprocess.Popen(
            controller_argv(settings, run.plan.run_id, lock_fd),
            stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(lock_fd,),
            start_new_session=True, env=_environment())
    finally:
        os.close(log)
    try:
        with run.reporter.status("handing the run to its background controller…"):
            _send_envs(process, run)
            taken = _taken_over(process, local_dir, START_WAIT + settings.connect_timeout)
    except BaseException:
        _end(process)       # it must not follow a run this controller stops
        raise
    if not taken:
        _end(process)
        run.reporter.emit(RunNote(run.plan.run_id, (
            f"the background controller did not start (see {log_path}); following the run "
            "here instead")))
        return False
    run.detached = True
    run.close()
    run.reporter.emit(Supervised(run.plan.run_id, process.pid, settings.restarts, str(log_path),
                                 runs_dir_flag(settings.runs_dir)))
    return True


def _send_envs(process: subprocess.Popen, run: Run) -> None:
    """Every host's env (spares' too), which a relaunch needs and the record never holds:
    on the background controller's stdin, never on a disk or a command line."""
    envs = {host.name: {name: [value.value, value.secret] for name, value in host.env.items()}
            for host in run.plan.inventory.hosts}
    try:
        process.stdin.write(json.dumps(envs).encode())
        process.stdin.close()
    except OSError:         # it ended already: _taken_over says so
        pass


def envs_of(text: bytes) -> dict[str, dict[str, EnvValue]]:
    """_send_envs' document as each host's env."""
    return {host: {name: EnvValue(value, bool(secret)) for name, (value, secret) in env.items()}
            for host, env in json.loads(text).items()}


def controller_argv(settings: RunSettings, run_id: str, lock_fd: int) -> list[str]:
    """The background controller's command line: the run's id on it, so that `inv down` can
    tell it from another process that later got its pid (is_controller)."""
    chosen = {"connect_timeout": settings.connect_timeout,
              "accept_new_host_keys": settings.accept_new_host_keys,
              "start_timeout": settings.start_timeout, "lost_after": settings.lost_after,
              "restarts": settings.restarts, "verbose": settings.verbose,
              "fetch_bytes": settings.fetch_limits.bytes, "shrink": settings.shrink,
              "min_workers": settings.min_workers}
    return [sys.executable, "-m", MODULE, "--run", run_id,
            "--runs-dir", str(settings.runs_dir.resolve()), "--lock-fd", str(lock_fd),
            "--settings", json.dumps(chosen), "--program", commandline.PROGRAM]


def settings_of(runs_dir: str, chosen: str) -> RunSettings:
    """The RunSettings of controller_argv's `--settings`."""
    fields = json.loads(chosen)
    limits = Limits(bytes=int(fields.pop("fetch_bytes")))
    return RunSettings(runs_dir=Path(runs_dir), fetch_limits=limits, detach=True, **fields)


def _environment() -> dict[str, str]:
    """This environment, with the directory this very `deploy` package was imported from
    first on the module path: the background controller runs the same code."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def _taken_over(process: subprocess.Popen, local_dir: Path, timeout: float) -> bool:
    """Whether the background controller wrote its pid into the record (it is connected to
    every host) before it ended or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            record = load_record(local_dir)
        except RecordError:
            record = None
        if record is not None and record.background and record.controller_pid == process.pid:
            return True
        time.sleep(0.1)
    return False


def _end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


# --- the background controller itself --------------------------------------------------------

def supervise(runs_dir: Path, run_id: str, settings: RunSettings, lock: FollowLock,
              envs: dict[str, dict[str, EnvValue]], reporter: Reporter) -> int:
    """Follow the run to its end with --restarts, as the controller that launched it would;
    SIGTERM (`inv down`, a shutdown) lets it go, running, without a controller."""
    local_dir = runs_dir / run_id
    record = load_record(local_dir)
    where = str(local_dir / RECORD_FILE)
    session = Session.open(Inventory(path=where, hosts=record.hosts), settings.connect_timeout,
                           settings.accept_new_host_keys)
    run = Run(record.plan(where, envs), session, local_dir, reporter, raw=settings.verbose,
              limits=settings.fetch_limits)
    run.attempt = record.attempt
    run.log_starts = record.log_starts()    # where hosts' logs began anew (a resumed run)
    run.filesystems = _filesystems(local_dir)
    run.interrupt_stops = False
    try:
        load_local_logs(run, None)
        run.set_state(RunState.RUNNING, controller_pid=os.getpid(), background=True)
        try:
            follow_to_end(run, settings, Restarter(settings.restarts),
                          NewPorts(settings.restarts))
        except (KeyboardInterrupt, HungUp) as interrupt:
            run.close()
            run.set_state(RunState.DETACHED, controller_pid=None, background=False)
            reporter.emit(FollowStopped(run_id, runs_dir_flag(runs_dir)))
            return exit_code(interrupt)
        except Exception as exc:
            # As `inv train` ends a run it can no longer follow: torn down, not left.
            reporter.emit(RunFailing(f"following the run: {exc}"))
            return finish(run, Finish.DONE) or 1
        return finish(run, Finish.DONE)
    finally:
        lock.release()


def _filesystems(local_dir: Path) -> dict[str, str | None]:
    """Which hosts share a filesystem, as the push found (push.json): a relaunch carries the
    chief's backup once per filesystem."""
    try:
        pushed = json.loads((local_dir / localdir.PUSH).read_text())
        return {name: answer.get("filesystem") for name, answer in pushed["hosts"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("--run", required=True)
    parser.add_argument("--runs-dir", required=True)
    parser.add_argument("--lock-fd", type=int, required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--program", choices=("inv", "tfdeploy"), default="inv")
    given = parser.parse_args(argv)
    # Its hints name the command the user ran `train` by, not this module.
    commandline.PROGRAM = given.program
    envs = envs_of(sys.stdin.buffer.read())
    # Nothing more comes from there; no terminal either.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # No terminal: a hang-up is nobody's; Ctrl-C's signal, sent by hand, lets the run go as
    # SIGTERM does (even where the starting shell left it ignored).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    private_umask()
    console = Console(file=sys.stdout, width=120, highlight=False, no_color=True,
                      force_terminal=False, force_interactive=False)
    reporter = ControllerLogReporter(console)
    lock = FollowLock.inherited(Path(given.runs_dir) / given.run, given.lock_fd)
    reporter.emit(RunNote(given.run, f"{time.strftime('%Y-%m-%d %H:%M:%S')} background "
                                     f"controller (pid {os.getpid()}) of run {given.run}"))
    try:
        with controller_signals():
            code = supervise(Path(given.runs_dir), given.run,
                             settings_of(given.runs_dir, given.settings), lock, envs,
                             reporter)
    except TfdeployError as exc:
        reporter.emit(RunNote(given.run, f"error: {exc}"))
        code = exc.exit_code
    reporter.emit(RunNote(given.run, f"{time.strftime('%Y-%m-%d %H:%M:%S')} background "
                                     f"controller ends (exit {code})"))
    return code


# --- inv logs --follow and inv down of such a run ------------------------------------------

def is_controller(pid: int | None, run_id: str) -> bool:
    """Whether `pid` is, now, the background controller of run `run_id` (a pid is reused
    once its process is gone: its command line must name the run). A zombie is not."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
        argv = _ps_argv(pid)        # no /proc (macOS)
    except OSError:
        return False
    return MODULE.encode() in argv and run_id.encode() in argv


def _ps_argv(pid: int) -> list[bytes]:
    try:
        done = subprocess.run(["ps", "-ww", "-o", "command=", "-p", str(pid)],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return done.stdout.split()


def supervised(record: RunRecord) -> bool:
    """Whether a background controller still has the run."""
    return (record.background and record.state.active
            and is_controller(record.controller_pid, record.run_id))


def stop_controller(record: RunRecord, reporter: Reporter) -> None:
    """`inv down` of a run with a background controller: stop that first (by its pid, only
    while it is that process), so that it neither relaunches what is being stopped nor
    writes the logs meanwhile."""
    pid = record.controller_pid
    if not supervised(record):
        return
    reporter.emit(RunNote(record.run_id, f"stopping the background controller of run "
                                         f"{record.run_id} (pid {pid})…"))
    for sig, wait in ((signal.SIGTERM, STOP_WAIT), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not is_controller(pid, record.run_id):
                return
            time.sleep(0.1)


def watch(local_dir: Path, record: RunRecord, only_task: int | None, raw: bool,
          reporter: Reporter) -> int:
    """`inv logs --follow` of a run its background controller has: the live view from the
    local logs it writes and its own log's lines, until it ends; the run's exit status.
    Ctrl-C stops watching only."""
    plan = record.plan(str(local_dir / RECORD_FILE))
    run = Run(plan, None, local_dir, reporter, only_task=only_task, writes_logs=False, raw=raw)
    pid, run_id = record.controller_pid, record.run_id
    read = {t.index: 0 for t in run.tasks}
    said = 0
    for task in run.tasks:
        task.state = "running"          # its controller, not this watcher, asks the hosts
    try:
        with reporter.watching(run.tasks, f"run {run_id}", raw):
            while True:
                alive = is_controller(pid, run_id)
                for task in run.tasks:
                    read[task.index] = _show_new_bytes(run, task, read[task.index])
                said = _show_new_lines(local_dir / localdir.CONTROLLER_LOG, said, reporter)
                reporter.refresh()
                if not alive:
                    break
                time.sleep(POLL)
    except (KeyboardInterrupt, HungUp) as interrupt:
        reporter.emit(FollowStopped(run_id, runs_dir_flag(local_dir.parent)))
        return exit_code(interrupt)
    ended = load_record(local_dir)
    if ended.state.active:
        reporter.emit(RunNote(run_id, (
            f"the background controller (pid {pid}) ended without ending run {run_id}: it "
            "goes on unsupervised")))
        return 1
    return 1 if ended.exit_code is None else ended.exit_code


def _show_new_bytes(run: Run, task, offset: int) -> int:
    path = localdir.task_log(run.dir, task.name)
    try:
        with path.open("rb") as log:
            log.seek(offset)
            while piece := log.read(READ_PIECE):
                offset += len(piece)
                run.show(task, task.replay(piece))
    except FileNotFoundError:
        pass
    return offset


def _show_new_lines(path: Path, offset: int, reporter: Reporter) -> int:
    """The whole lines of `path` after `offset`; the offset after the last of them."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return offset
    whole = data[:data.rfind(b"\n") + 1]
    for line in whole.splitlines():
        reporter.emit(ControllerOutput(line.decode("utf-8", "replace")))
    return offset + len(whole)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
