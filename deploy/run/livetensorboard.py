"""runs/<id>/tensorboard kept up with the chief's TensorBoard logs while a run is followed
(`inv train`, `inv logs --follow`), so that `tensorboard --logdir runs/<id>/tensorboard` shows
the curves as they grow.

After an epoch of the chief, at most every INTERVAL seconds, the chief's host is asked for what
its TensorBoard files have beyond the local copy's sizes: event files only grow, so only new
bytes travel. One fetch at a time, beside the follow (a thread of its own), so that a slow one
never holds the live view. The run's end fetches the chief's whole output (finish.py), and
runs/<id>/tensorboard then becomes the link to it (state/localdir.py).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath

from deploy.host.archive import Limits
from deploy.state import localdir
from deploy.state.events import ArchiveNote

INTERVAL = 10.0
# One fetch at most: what is past it comes with the next.
PER_FETCH = Limits(bytes=64 << 20, members=1000)
TIMEOUT = 60.0


class LiveTensorBoard:
    def __init__(self, run):
        self.run = run
        self.dir = run.dir / localdir.TENSORBOARD
        chief = run.plan.chief_host.tasks[0].index
        self.chief = next(t for t in run.tasks if t.index == chief)
        self.synced_epoch = None
        self.last = -INTERVAL
        self.fetching: threading.Thread | None = None
        self.problem = ""              # the last fetch's, said once by the follow's thread
        self.said = False

    def tick(self) -> None:
        """Called by the follow loop: start a fetch when the chief has ended an epoch since
        the last one, none is running, and INTERVAL has passed."""
        if self.problem and not self.said:
            self.said = True
            self.run.reporter.emit(ArchiveNote(f"TensorBoard logs not synced live: "
                                               f"{self.problem}"))
        epoch = self.chief.epoch
        if epoch is None or epoch == self.synced_epoch or self.dir.is_symlink():
            return
        if self.fetching is not None and self.fetching.is_alive():
            return
        now = time.monotonic()
        if now - self.last < INTERVAL:
            return
        self.synced_epoch, self.last = epoch, now
        self.fetching = threading.Thread(target=self.fetch, daemon=True, name="tensorboard")
        self.fetching.start()

    def fetch(self) -> None:
        sizes = local_sizes(self.dir)
        if sum(sizes.values()) >= self.run.limits.bytes:
            return                     # as much as the run's whole output may hold
        staging = Path(tempfile.mkdtemp(prefix=".tensorboard-", dir=self.run.dir))
        try:
            offsets = self.run.session.fetch_tensorboard_tails(self.run.plan, sizes, staging,
                                                               PER_FETCH, TIMEOUT)
            apply_tails(staging, self.dir, offsets)
            self.problem = ""
        except Exception as exc:       # tried again after the next epoch; said once
            self.problem = str(exc)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def close(self) -> None:
        """Let a fetch under way end before the run's end replaces the copy (a short wait: an
        interrupted run does not wait for it)."""
        if self.fetching is not None:
            self.fetching.join(5)


def local_sizes(folder: Path) -> dict[str, int]:
    """The size of every regular file under `folder`, by name relative to it."""
    sizes = {}
    for top, _, files in os.walk(folder):
        for name in files:
            path = Path(top, name)
            if path.is_file() and not path.is_symlink():
                sizes[path.relative_to(folder).as_posix()] = path.stat().st_size
    return sizes


def apply_tails(staging: Path, target: Path, offsets: dict[str, int]) -> None:
    """Put each piece unpacked in `staging` where it goes in `target`: a piece from offset 0
    replaces the file, a later one extends it when the local file ends where the piece starts
    (else it waits: the next fetch asks from where the file ends). The names come from a
    host: one that would leave `target` is not used."""
    for name, offset in offsets.items():
        parts = PurePosixPath(name).parts
        if not parts or name.startswith("/") or any(p in ("..", ".") for p in parts):
            continue
        piece = staging.joinpath(*parts)
        if piece.is_symlink() or not piece.is_file():
            continue                   # not unpacked (archive.py skipped it)
        dest = target.joinpath(*parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if offset == 0:
            os.replace(piece, dest)
        elif dest.is_file() and not dest.is_symlink() and dest.stat().st_size == offset:
            with open(dest, "ab") as out, open(piece, "rb") as new:
                shutil.copyfileobj(new, out)
