"""The incremental payload push as the controller runs it: hash locally, ask every host what
it lacks, send each host only that, say what travelled."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, ContextManager, Iterable, Mapping


from deploy.errors import Failure
from deploy.plan.checks import room_problem
from deploy.plan.planner import HostPlan, RunPlan
from deploy.push.bundle import FileEntry, FileStream, SharedStreams, manifest, stage_tar
from deploy.push.hashcache import HashCache
from deploy.cluster.session import Session

# What a push shows while it works: a step's text for as long as it runs (an object whose
# update() changes it), and a line that says what the hosts lacked.
Status = Callable[[str], ContextManager]
Tell = Callable[[str], None]

# Recently changed content sent along with the manifest, at most this much per push.
INLINE_BYTES = 1 << 20


class NoRoom(Failure):
    """A host's disk lacks the room for the files a push must send it; none were sent."""


def refuse_without_room(plans: Iterable[HostPlan], answers: Mapping[str, dict],
                        sizes: Mapping[str, int], what: str) -> None:
    """Before any file travels: each host's free bytes (its answer) against exactly the
    contents its cache lacks (`sizes`: sha256 -> bytes), margin included: a host that lacks
    nothing still needs the margin, for the run's logs and output. A host that shares its
    workdir with another is sent nothing. The room figures are taken out of the answers: they
    are for this judgement, not for the push's record."""
    problems = []
    for hp in plans:
        answer = answers[hp.host.name]
        free, where = answer.pop("disk_free", None), answer.pop("disk_path", None)
        if answer.get("shared_with") or free is None:
            continue
        lacking = sum(sizes[d] for d in set(answer["missing"]))
        problem = room_problem(hp.host.label, free, where, lacking)
        if problem:
            problems.append(problem)
    if problems:
        raise NoRoom("; ".join(problems) + f" — no {what} file was sent, nothing started")


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # unreachable


class PayloadPush:
    """One run's payload: its manifest and stage are built before any host is touched, so a
    bad payload (missing entry, symlink out of it) changes nothing anywhere."""

    def __init__(self, payload: Path, entry: str, run_id: str, hash_cache: Path | None = None,
                 walked: list[Path] | None = None):
        self.payload = payload
        # Saved only after a push that reached every host: nothing is written here before
        # then, and files of a failed push still count as changed (they ride along again).
        self.hashes = HashCache(hash_cache)
        self.files: tuple[FileEntry, ...] = manifest(payload, entry, self.hashes, walked)
        self.stage = stage_tar(run_id, self.files, self.riders(self.hashes.changed), payload)
        self.streams = SharedStreams()

    def riders(self, changed: set[str]) -> list[FileEntry]:
        """Files changed since the last push (their hash was not remembered), smallest first,
        up to INLINE_BYTES: they ride along with the manifest, so that the usual edit of a few
        small files costs one round trip instead of two. A host that has them already just
        discards them."""
        riders, budget, taken = [], INLINE_BYTES, set()
        for f in sorted(self.files, key=lambda f: f.size):
            if f.size > budget:
                break
            if os.path.abspath(self.payload / f.path) in changed and f.sha256 not in taken:
                riders.append(f)
                taken.add(f.sha256)
                budget -= f.size
        return riders

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def content(self, wanted: frozenset[str]) -> FileStream:
        return self.streams.get(self.payload, self.files, wanted)

    def changed(self, answers: dict[str, dict]) -> str:
        """`payload: 3 of 1000 files changed (12.0 KiB) → 4 of 4 host(s)`: the contents some
        host lacked (whether they rode along with the manifest or travel next)."""
        # Hosts that share a workdir are one receiver: the first of them (whichever of them
        # took the files that rode along).
        followers = [name for name, a in answers.items() if a.get("shared_with")]
        lacking: dict[str, set[str]] = {}
        for name, a in answers.items():
            lacking.setdefault(a.get("shared_with") or name, set()).update(
                a["missing"], a["received"])
        union = set().union(*lacking.values()) if lacking else set()
        changed = [f for f in self.files if f.sha256 in union]
        size = sum({f.sha256: f.size for f in changed}.values())
        receivers = sum(1 for hashes in lacking.values() if hashes)
        shared = f"; {len(followers)} host(s) share a workdir with another" if followers else ""
        return (f"payload: {len(changed)} of {len(self.files)} file(s) changed "
                f"({size_text(size)}) → {receivers} of {len(answers)} host(s){shared}")

    def send(self, session: Session, plan: RunPlan, status: Status, tell: Tell) -> dict:
        """Push to every host in parallel; returns a record of what each host was sent.
        `status` shows a step while it runs, `tell` says what the hosts lacked."""
        with status(f"payload: {len(self.files)} file(s), {size_text(self.total_bytes)}; "
                    f"asking {len(plan.hosts)} host(s) what they lack…") as shown:
            def on_answers(answers: dict[str, dict]) -> None:
                refuse_without_room(plan.hosts, answers,
                                    {f.sha256: f.size for f in self.files}, "payload")
                tell(self.changed(answers))
                shown.update("payload: sending and assembling on every host…")
            answers = session.push(list(plan.hosts), "payload", lambda hp: hp.push,
                                   lambda hp: self.stage, lambda hp, wanted: self.content(wanted),
                                   on_answers)
        self.hashes.save()
        return {"files": len(self.files), "bytes": self.total_bytes, "hosts": answers}
