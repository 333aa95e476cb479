"""The end of a run, however it ends: artifacts, stop, the last log bytes, teardown on every
host, summary.json and the record's final state. Shared by `inv train`, `inv logs --follow`
and `inv down`.
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from deploy.commandline import command
from deploy.console.plot import plot_losses
from deploy.run.run import Run
from deploy.run.signals import (
    EXIT_HUNG_UP, EXIT_INTERRUPTED, EXIT_OUTPUT_CLOSED, EXIT_TERMINATED, Abandoned, HungUp,
    OutputClosed, Terminated, tearing_down
)
from deploy.state import lifetime, localdir
from deploy.state.events import (
    ArchiveNote, PlotFailed, Reporter, RunSummary, TeardownAbandoned, snapshot
)
from deploy.state.progress import NO_EPOCHS, TaskProgress, losses_agree, told_epochs
from deploy.state.record import RecordError, RunState, load_record, write_json


class Finish:
    """How a run ends: which end-of-run steps run, in order."""
    DONE = "done"                # the tasks ended: fetch artifacts, clean up
    INTERRUPTED = "interrupted"  # Ctrl-C: stop, read the last log bytes, clean up
    TERMINATED = "terminated"    # SIGTERM: as Ctrl-C, with its own exit status
    DOWN = "down"                # `inv down`: fetch artifacts, stop, read the rest, clean up
    # The terminal closed, or stdout's reader went away, before any task started: nothing to
    # leave running, so it is stopped as by Ctrl-C, with the exit status of its cause.
    HUNG_UP = "hung up"
    OUTPUT_CLOSED = "output closed"

    @staticmethod
    def by(interrupt: KeyboardInterrupt | HungUp) -> str:
        """How a run stopped by `interrupt` (Ctrl-C, SIGTERM, or a hangup before its tasks
        started) ends."""
        if isinstance(interrupt, HungUp):
            return Finish.OUTPUT_CLOSED if isinstance(interrupt, OutputClosed) else \
                Finish.HUNG_UP
        return Finish.TERMINATED if isinstance(interrupt, Terminated) else Finish.INTERRUPTED


def finish(run: Run, how: str, ended: dict | None = None) -> int:
    """Fetch what the run made, tear it down everywhere, write the summary and the record.
    Runs on every exit path once anything was started, including Ctrl-C and errors. A second
    interrupt abandons the teardown (abandon()). `ended`: the summary of a run that had
    already ended (`inv down` once a host lost during it answers again); it is kept, with
    what this teardown could not do in place of what the run's end could not, and so is the
    record's state: rewriting them would forget the run's end (a finished run would show as
    down, its tasks pending, and `inv resume` would start it again)."""
    session, reporter, local_dir = run.session, run.reporter, run.dir
    # Hosts lost during the run whose tasks went elsewhere are not asked: they are named at
    # the end, and `inv down` (which asks every host of the record) cleans them later.
    lost = tuple(hp.host.name for hp in run.plan.hosts if hp.host.name in run.lost
                 and not hp.tasks)
    plan = run.plan.without(lost)
    problems: list[str] = list(run.problems)
    artifacts = 0
    try:
        with tearing_down(), reporter.status("stopping tasks and fetching results…"):
            if how in (Finish.DONE, Finish.DOWN):
                try:
                    artifacts = session.fetch_output(
                        plan, local_dir / localdir.ARTIFACTS, run.limits,
                        lambda line: reporter.emit(ArchiveNote(line)))
                except Exception as exc:  # reported; teardown still runs
                    problems.append(f"fetching artifacts: {exc}")
            if how == Finish.DOWN or (how in STOPPED_EXIT and not run.stopped_clean):
                problems += session.stop(plan).values()
                if run.writes_logs:
                    _drain_logs(run)
            problems += session.cleanup(plan).values()
    except Abandoned as abandoned:
        return abandon(run, abandoned)
    finally:
        run.close()
    code = _exit_code(run, how, problems)
    wall_time = ended.get("wall_time_s") if ended else _wall_time(local_dir)
    plot = draw_loss_plot(run.tasks, local_dir, plan.run_id, reporter)
    tensorboard = localdir.link_tensorboard(local_dir)
    if ended:
        write_json(local_dir / localdir.SUMMARY,
                   dict(ended, teardown_problems=problems, lost_hosts=list(lost)))
    else:
        write_json(local_dir / localdir.SUMMARY,
                   dict(_summary(run, artifacts, problems, code, how, wall_time, plot,
                                 tensorboard), lost_hosts=list(lost)))
        state = {Finish.DONE: RunState.FINISHED, Finish.DOWN: RunState.DOWN}.get(
            how, RunState.INTERRUPTED)
        if not problems or how == Finish.DONE:
            run.set_state(state, exit_code=code, ended=time.time())
        if how == Finish.DONE and code == 0:
            localdir.drop_kept_backup(local_dir)
    told = told_epochs(run.tasks) or not any(t.state == "exited" for t in run.tasks)
    reporter.emit(RunSummary(
        plan.run_id, code, tuple(snapshot(t) for t in run.tasks), wall_time,
        losses_agree(run.tasks), tuple(problems), len(plan.hosts),
        str(local_dir / localdir.SUMMARY), artifacts, str(local_dir / localdir.ARTIFACTS),
        None if plot is None else str(plot), None if tensorboard is None else str(tensorboard),
        None if told else NO_EPOCHS, lost))
    return code


def abandon(run: Run, abandoned: Abandoned) -> int:
    """A second interrupt during teardown: leave at once, saying what may be left where and
    how to finish the job. The record stays active, without a controller, for `inv down`."""
    run.close()
    run.set_state(load_record(run.dir).state, controller_pid=None)
    busy = [hp.host.name for hp in run.plan.hosts
            if any(not t.finished for t in run.tasks if t.host == hp.host.name)]
    left = (f"tasks may still run on {', '.join(busy)}" if busy else
            "no task is known to run, but run directories may be left")
    run.reporter.emit(TeardownAbandoned(
        left, f"{command('down')} --run {run.plan.run_id}{runs_dir_flag(run.dir.parent)}"))
    return abandoned.exit_code


def runs_dir_flag(runs_dir: Path) -> str:
    """` --runs-dir DIR` for a command line to copy, or nothing for the default runs/."""
    return "" if runs_dir == Path("runs") else f" --runs-dir {shlex.quote(str(runs_dir))}"


def draw_loss_plot(tasks: list[TaskProgress], local_dir: Path, run_id: str,
                   reporter: Reporter) -> Path | None:
    """runs/<id>/loss.png from the tasks' losses; None when there were none to draw."""
    path = local_dir / localdir.LOSS_PLOT
    try:
        return path if plot_losses(tasks, path, f"run {run_id}") else None
    except OSError as exc:  # a full disk must not hide how the run ended
        reporter.emit(PlotFailed(str(path), str(exc)))
        return None


def _wall_time(local_dir: Path) -> float | None:
    """Seconds from the run's start (its record) to now."""
    try:
        return time.time() - load_record(local_dir).started
    except RecordError:
        return None


def _drain_logs(run: Run) -> None:
    """After a stop, read what the tasks wrote last, so the local logs are complete."""
    try:
        run.catch_up(print_lines=False)
    except Exception:  # best effort: the run is being torn down anyway
        pass


# How a run stopped ends: its exit status, whatever its teardown met, is its cause's.
STOPPED_EXIT = {Finish.INTERRUPTED: EXIT_INTERRUPTED, Finish.TERMINATED: EXIT_TERMINATED,
                Finish.HUNG_UP: EXIT_HUNG_UP, Finish.OUTPUT_CLOSED: EXIT_OUTPUT_CLOSED}


def _exit_code(run: Run, how: str, problems: list[str]) -> int:
    if how in STOPPED_EXIT:
        return STOPPED_EXIT[how]
    if how == Finish.DOWN:
        return 1 if problems else 0
    if problems or run.failure:
        return 1
    return 0 if lifetime.succeeded(run.tasks, run.plan.has_roles) else 1


def _summary(run: Run, artifacts: int, problems: list[str], code: int, how: str,
             wall_time: float | None, plot: Path | None, tensorboard: Path | None) -> dict:
    return {
        "run_id": run.plan.run_id,
        "exit_code": code,
        "wall_time_s": None if wall_time is None else round(wall_time, 3),
        "loss_plot": None if plot is None else str(plot),
        "tensorboard": None if tensorboard is None else str(tensorboard),
        "interrupted": how in STOPPED_EXIT,
        "ended_by": how,
        "attempts": run.attempt,
        "failed_attempts": run.attempts,
        "failure": None if not run.failure else {
            "task": run.failure[0].name, "reason": run.failure[1]},
        "losses_agree": losses_agree(run.tasks),
        "artifact_files": artifacts,
        "teardown_problems": problems,
        "tasks": [{
            "task": t.name, "role": t.role, "host": t.host, "state": t.state,
            "exit_code": t.code, "relaunches": t.relaunches,
            "duration_s": None if t.duration is None else round(t.duration, 3),
            "epochs": t.epoch, "epochs_total": t.epochs_total, "final_loss": t.loss,
            "metrics": t.metrics, "losses": t.losses, "val_losses": t.val_losses,
            "gpu": t.gpu, "gpu_memory_peak_mib": t.gpu_memory_peak,
        } for t in run.tasks],
    }
