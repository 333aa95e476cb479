"""The remote side of one run: every step on every host, as requests to one agent per host
(agent.py) on one transport per host.

Each method asks every host before it waits for any answer, and waits for all of them, so a
failure on one host is reported together with what happened on the others. Every step has a
deadline for the whole step: a host that has not answered by then is reported as such.
"""
from __future__ import annotations

import contextlib
import io
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Hashable, Iterable, Mapping

from deploy.host.archive import ROOM_MARGIN, Limits, Refused, size, unpack
from deploy.host.protocol import PortsFreeRequest, TaskStatus, quoted
from deploy.inventory.model import Host, Inventory
from deploy.plan.command import Request
from deploy.plan.planner import (
    HostPlan, RunPlan, cleanup_request, fetch_backup_request, fetch_output_request, host_offsets,
    poll_request, receive_request, replace_backup_request, stop_request, tensorboard_tail_request
)
from deploy.plan.ports import choose_ports, task_ports
from deploy.cluster import keptbackup
from deploy.cluster.hostagent import Body, HostAgent, Reply, StepFailed
from deploy.cluster.parallel import HostsFailed, on_all, on_each
from deploy.transport.base import CommandResult, Transport
from deploy.transport.connect import connect
from deploy.timeline import mark


def checked(result: CommandResult, host: Host, step: str) -> CommandResult:
    if result.code != 0:
        raise StepFailed(f"{host.label}: {step} failed: {result.error_text()}")
    return result


# Where the limit of an archive from a host is set (tasks.py), for the refusal's message.
LIMIT_FLAG = "--max-fetch"


class BodyFile:
    """An archive from a host, written to disk as it comes (an unnamed file in `folder`, the
    disk it unpacks to), never held in the controller's memory; at most `limits.archive_bytes`
    (agent.py answer_bounds), and only when the disk has room for it."""

    def __init__(self, folder: Path, limits: Limits):
        self.folder, self.limit = folder, limits.archive_bytes
        self.file = None
        self.size = 0
        self.problem = ""

    def begin(self, length: int) -> None:
        self.size = length
        try:
            free = shutil.disk_usage(self.folder).free
            if length + ROOM_MARGIN > free:
                self.problem = (f"its {size(length)} do not fit in {self.folder} "
                                f"({size(free)} free)")
                return
            self.file = tempfile.TemporaryFile(dir=self.folder)
        except OSError as exc:       # the rest of the body is read and dropped
            self.problem = f"cannot write it into {self.folder}: {exc.strerror or exc}"

    def write(self, piece: bytes) -> None:
        if self.file is None:
            return                 # refused: the rest of the body is read and dropped
        try:
            self.file.write(piece)
        except (OSError, ValueError) as exc:      # a full disk; closed after a timeout
            self.problem = f"cannot write it into {self.folder}: {exc.strerror or exc}"
            self.close()

    def ready(self, label: str, what: str):
        """The archive from its start, or None when none came; StepFailed naming the host
        when it could not be kept."""
        if self.problem:
            raise StepFailed(f"{label}: {what}: {self.problem}")
        if self.file is None:
            return None
        self.file.flush()
        self.file.seek(0)
        return self.file

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def __enter__(self) -> "BodyFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def refused(label: str, what: str, archive: int, exc: Refused, limits: Limits) -> StepFailed:
    """`h1 (…): the chief's output refused: its 2.0 MiB archive: it would unpack to more than
    1.0 GiB (the limit); --max-fetch raises it`."""
    hint = f"; {LIMIT_FLAG} raises it" if exc.over_limit else ""
    return StepFailed(f"{label}: {what} refused: its {size(archive)} archive: {exc}{hint}")


def skipped_lines(label: str, what: str, names, count: int) -> list[str]:
    """A warning per member skipped (the first few), naming the host and the member."""
    lines = [f"{label}: skipped {quoted(name)} of {what}: {why}" for name, why in names]
    if count > len(names):
        lines.append(f"{label}: skipped {count - len(names)} more member(s) of {what}")
    return lines


def sharing(groups: Mapping[str, Hashable | None]) -> dict[str, str]:
    """Hosts whose push answers name one group (a workdir they share, deploy/host/share.py, and
    for data the same tree): follower name -> the first such host (in the given order), which
    alone is sent files. None is a group of its own (a filesystem that could not be told)."""
    first: dict[Hashable, str] = {}
    followers = {}
    for name, group in groups.items():
        if group is not None:
            leader = first.setdefault(group, name)
            if leader != name:
                followers[name] = leader
    return followers


def filesystem_groups(filesystems: Mapping[str, str | None],
                      key: Callable[[str], Hashable] = lambda name: "") -> dict[str, Hashable]:
    """Each host's group for sharing(): its filesystem id with `key` of the host; None for a
    host whose filesystem was not told."""
    return {name: None if not fs else (fs, key(name)) for name, fs in filesystems.items()}


def backup_targets(chief: str, hosts: Iterable[str],
                   filesystems: Mapping[str, str | None]) -> list[str]:
    """The hosts to write the chief's backup to: one per filesystem (the first in order), none
    on the chief's own, and each whose filesystem is not known."""
    names = [chief, *(name for name in hosts if name != chief)]
    followers = sharing(filesystem_groups({name: filesystems.get(name) for name in names}))
    return [name for name in names[1:] if name not in followers]


# What a session asks of a host's agent as soon as it has started (the checks' probe), while
# other hosts still log in: (host, its agent) -> the reply.
FirstAsk = Callable[[Host, HostAgent], Reply]


class Session:
    def __init__(self, transports: Mapping[str, Transport], agents: Mapping[str, HostAgent],
                 first_replies: Mapping[str, Reply] | None = None):
        self.transports, self.agents = dict(transports), dict(agents)
        # The replies to open_each's `first`, by host name, for whoever takes them.
        self.first_replies = dict(first_replies or {})

    @classmethod
    def open(cls, inventory: Inventory, connect_timeout: float,
             accept_new_host_keys: bool, first: FirstAsk | None = None) -> "Session":
        """Log in to every host and start its agent, or raise HostsFailed naming every
        failure."""
        session, errors = cls.open_each(inventory.hosts, connect_timeout, accept_new_host_keys,
                                        first)
        if errors:
            session.close()
            raise HostsFailed("connecting", errors)
        return session

    @classmethod
    def open_each(cls, hosts: Iterable[Host], connect_timeout: float,
                  accept_new_host_keys: bool, first: FirstAsk | None = None,
                  ) -> tuple["Session", dict[str, BaseException]]:
        """Log in to every host and start its agent; the hosts where that failed, and why.
        `first` is asked of each agent right behind its start (on its stdin, which it reads
        once it runs): its answer comes while other hosts still log in, not a round trip
        after the slowest of them."""
        def start(host: Host) -> tuple[Transport, HostAgent, Reply | None]:
            transport = connect(host, connect_timeout, accept_new_host_keys)
            mark("login", host.name)
            agent = None
            try:
                agent = HostAgent(host, transport)
                reply = first(host, agent) if first is not None else None
                agent.wait_started(connect_timeout)
                mark("agent", host.name)
                return transport, agent, reply
            except BaseException:
                if agent is not None:
                    agent.close()
                transport.close()
                raise
        results, errors = on_each(hosts, lambda h: h.name, start)
        return cls({n: t for n, (t, _, _) in results.items()},
                   {n: a for n, (_, a, _) in results.items()},
                   {n: r for n, (_, _, r) in results.items() if r is not None}), errors

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        for transport in self.transports.values():
            transport.close()

    def ask_each(self, step: str, plans: Iterable[HostPlan], request: Callable[[HostPlan], Request],
                 timeout: float, body: Callable[[HostPlan], Body] = lambda hp: b"",
                 ) -> tuple[dict, dict[str, BaseException]]:
        """Ask every host, then wait for every answer until one deadline for the whole step:
        (answers, errors) by host name."""
        replies = {hp.host.name: self.agents[hp.host.name].ask(request(hp), step, body(hp))
                   for hp in plans}
        return gather(replies, timeout)

    def ask_all(self, step: str, plans: Iterable[HostPlan], request: Callable[[HostPlan], Request],
                timeout: float, body: Callable[[HostPlan], Body] = lambda hp: b"",
                ) -> dict:
        """Like ask_each, but raise one HostsFailed naming every failure."""
        answers, errors = self.ask_each(step, plans, request, timeout, body)
        if errors:
            raise HostsFailed(step, errors)
        return answers

    def push(self, plans: list[HostPlan], what: str, request: Callable[[HostPlan], Request],
             stage: Callable[[HostPlan], bytes],
             content: Callable[[HostPlan, frozenset[str]], Iterable[bytes]],
             on_answers: Callable[[dict[str, dict]], None] = lambda answers: None,
             group: Callable[[HostPlan], Hashable] = lambda hp: "",
             ) -> dict[str, dict]:
        """Two requests per host: the stage (its helper and manifest; for the payload also
        small recent files) is answered with the file contents the host's cache still lacks;
        then exactly those travel and the host assembles the directory (a host that lacks
        nothing has done so, or had it, at its answer: an unchanged payload costs one round
        trip). `what` ("payload", "data") names the steps in errors. Returns each host's
        record: missing hashes, received (both steps), files.

        Hosts that share a workdir (and `group`: for data, the same tree) are sent the files
        once: the others wait for that push to end, then get an empty stream and find payload/
        (or the cached files) there. Each answer keeps the filesystem id it named."""
        wants = {name: want.document() for name, want in
                 self.ask_all(f"{what} push", plans, request, 120, stage).items()}
        by_name = {hp.host.name: hp for hp in plans}
        groups = filesystem_groups({name: want.get("filesystem") for name, want in wants.items()},
                                   lambda name: group(by_name[name]))
        for follower, leader in sharing(groups).items():
            wants[follower]["shared_with"] = leader
        on_answers(wants)
        done = {hp.host.name: threading.Event() for hp in plans}

        def send(hp: HostPlan) -> dict:
            try:
                return send_files(hp)
            finally:
                done[hp.host.name].set()

        def send_files(hp: HostPlan) -> dict:
            want = wants[hp.host.name]
            if want.get("assembled") or want.get("present"):
                return want
            leader = want.get("shared_with")
            missing = frozenset() if leader else frozenset(want["missing"])
            if leader:
                done[leader].wait()
            agent = self.agents[hp.host.name]
            reply = agent.ask(receive_request(request(hp)), f"sending {what} files",
                              files=content(hp, missing))
            try:
                answer = reply.wait(1800).document()
            except StepFailed:
                agent.resync(reply)      # the teardown needs an agent that reads requests
                raise
            told = {"filesystem": want["filesystem"]} if "filesystem" in want else {}
            if leader:
                return {**answer, **told, "missing": [], "received": [], "shared_with": leader}
            return {**answer, **told, "missing": want["missing"],
                    "received": want["received"] + answer["received"]}
        return on_all(f"sending {what} files", plans, lambda hp: hp.host.name, send)

    def free_ports(self, plan: RunPlan) -> dict[int, int]:
        """A free port per task, distinct across the whole cluster: TensorFlow binds every
        interface, so two hosts that are one machine (a loopback lab) must not share one."""
        answers = self.ask_all("choosing ports", plan.hosts, lambda hp: hp.ports, 60)
        chosen = choose_ports([(hp.host, hp.host.cluster_tasks) for hp in plan.hosts],
                              {name: list(answer.ports) for name, answer in answers.items()})
        return task_ports(plan.tasks, chosen)

    def ports_free(self, host: str, ports: tuple[int, ...]) -> tuple[int, ...]:
        """Which of `ports` are free on `host` now."""
        return self.agents[host].ask(Request(PortsFreeRequest(ports)),
                                     "probing ports").wait(60).ports

    def launch(self, plan: RunPlan, attempt: int = 1, only: int | None = None) -> None:
        """Start every task (or the task of index `only`, relaunched in place). The attempt
        (1, then 2... under --restarts) also tells the agent to set the previous attempt's
        files aside and mark the log."""
        replies = {}
        for hp in plan.hosts:
            for task in hp.tasks:
                if only is None or task.index == only:
                    replies[(hp.host.name, task.index)] = self.agents[hp.host.name].ask(
                        task.launch, f"starting {task.name}", TFDEPLOY_ATTEMPT=str(attempt))
        _, errors = gather(replies, 60)
        if errors:
            raise HostsFailed("starting tasks", {name: error for (name, _), error in
                                                 errors.items()})

    def poll(self, plan: RunPlan, offsets: Mapping[int, int],
             ) -> tuple[dict[int, TaskStatus], dict[str, BaseException]]:
        """One answer per host: (statuses by task index, errors by host name). Used for the
        last read of the logs after a stop; live following goes through follow.py."""
        results, errors = self.ask_each("poll", [hp for hp in plan.hosts if hp.tasks],
                                        lambda hp: poll_request(
                                            hp.run_dir, host_offsets(hp, offsets)), 30)
        answers = {}
        for host, polled in results.items():
            keys = plan.by_key(host)
            answers.update({keys[k].index: status for k, status in polled.tasks.items()
                            if k in keys})
        return answers, errors

    def stop(self, plan: RunPlan) -> dict[str, str]:
        """TERM every task's process group, KILL after the grace period. Returns a problem per
        host: survivors, or no answer (nothing is assumed gone that was not seen gone)."""
        return self._ending(plan, lambda hp: stop_request(hp.run_dir, plan.options.grace))

    def cleanup(self, plan: RunPlan) -> dict[str, str]:
        """Stop, then delete each host's run directory; problems by host, as for stop."""
        return self._ending(plan, lambda hp: cleanup_request(hp.host, hp.run_dir,
                                                             plan.options.grace, plan.run_id))

    def _ending(self, plan: RunPlan, request: Callable[[HostPlan], Request]) -> dict[str, str]:
        results, errors = self.ask_each("teardown", plan.hosts, request, plan.options.grace + 60)
        problems = {name: str(error) for name, error in errors.items()}
        for name, stopped in results.items():
            if stopped.survivors:
                pids = ", ".join(map(str, stopped.survivors))
                problems[name] = f"{name}: processes of the run still alive after SIGKILL: {pids}"
        return problems

    def fetch_output(self, plan: RunPlan, into: Path, limits: Limits,
                     warn: Callable[[str], None]) -> int:
        """Copy the chief's TFDEPLOY_OUTPUT_DIR into `into` (archive.py: nothing outside it,
        within `limits`); return the number of files. Each member skipped is passed to `warn`,
        naming the host and the member."""
        hp = plan.chief_host
        label, what = hp.host.label, "the chief's output"
        into.parent.mkdir(parents=True, exist_ok=True)
        with BodyFile(into.parent, limits) as spool:
            self.agents[hp.host.name].ask(fetch_output_request(hp.run_dir, limits),
                                          "fetching output", into=spool).wait(600)
            archive = spool.ready(label, f"fetching {what}")
            if archive is None:
                return 0
            try:
                done = unpack(archive, str(into), limits)
            except Refused as exc:
                raise refused(label, what, spool.size, exc, limits) from None
        for line in skipped_lines(label, what, done.skipped, done.skipped_count):
            warn(line)
        return done.files

    def fetch_tensorboard_tails(self, plan: RunPlan, sizes: Mapping[str, int], into: Path,
                                limits: Limits, timeout: float) -> dict[str, int]:
        """What the chief's TensorBoard logs have beyond `sizes`, unpacked into the empty
        directory `into` as archive.py unpacks (nothing outside it, within `limits`): each
        piece's offset in its file, by name."""
        hp = plan.chief_host
        with BodyFile(into, limits) as spool:
            reply = self.agents[hp.host.name].ask(tensorboard_tail_request(hp.run_dir, sizes,
                                                                           limits),
                                                  "fetching TensorBoard logs", into=spool)
            offsets = reply.wait(timeout).offsets
            archive = spool.ready(hp.host.label, "fetching TensorBoard logs")
            if archive is None:
                return {}
            try:
                unpack(archive, str(into), limits)
            except Refused as exc:
                raise refused(hp.host.label, "the TensorBoard logs", spool.size, exc,
                              limits) from None
        return offsets

    def keep_backup(self, hp: HostPlan, limits: Limits, kept: Path) -> int | None:
        """Renew the file `kept`, the controller's copy of the chief's TFDEPLOY_BACKUP_DIR
        (`hp` is its host), from what changed there since (keptbackup.py), checked against
        `limits`: the copy which outlives the chief's host. The bytes that travelled; None
        when the chief has no backup yet (`kept` stays as it was)."""
        label, what = hp.host.label, "the chief's backup"
        kept.parent.mkdir(parents=True, exist_ok=True)
        with BodyFile(kept.parent, limits) as spool:
            listing = self.agents[hp.host.name].ask(
                fetch_backup_request(hp.run_dir, limits, keptbackup.known(kept)),
                "fetching the backup", into=spool).wait(600)
            changed = spool.ready(label, f"fetching {what}")
            if not listing.exists:
                return None
            try:
                keptbackup.renew(kept, changed, listing.files, limits)
            except Refused as exc:
                raise refused(label, what, spool.size, exc, limits) from None
            return spool.size if changed is not None else 0

    def carry_backup(self, plan: RunPlan, filesystems: Mapping[str, str | None],
                     limits: Limits, kept: Path, source: str | None,
                     warn: Callable[[str], None]) -> tuple[int, list[str]]:
        """Write the kept copy of the chief's backup (keep_backup; none kept: no backup) over
        the TFDEPLOY_BACKUP_DIR of every host of `plan` that runs tasks (no shared disk between
        bare machines; BackupAndRestore restores every worker from the chief's backup),
        unpacked there as archive.py unpacks. `filesystems` (host name -> the filesystem id
        its push answered): hosts sharing a workdir share the run directory, so the backup is
        written once per filesystem, and not at all on that of `source`, the host the copy
        was just taken from. Returns the size of the archive carried and the hosts it was
        written to."""
        targets = backup_targets(source or "", [hp.host.name for hp in plan.hosts if hp.tasks],
                                 filesystems)
        others = [hp for hp in plan.hosts if hp.host.name in targets]
        with contextlib.ExitStack() as stack:
            data: Body = (stack.enter_context(kept.open("rb")) if kept.is_file()
                          else _empty_tar_gz())
            answers = self.ask_all("carrying the backup", others,
                                   lambda hp: replace_backup_request(hp.run_dir, limits), 600,
                                   lambda hp: data)
        what = f"the chief's backup{f' from {source}' if source else ''}"
        for name, done in answers.items():
            for line in skipped_lines(name, what, done.skipped, done.skipped_count):
                warn(line)
        return (kept.stat().st_size if kept.is_file() else 0), [hp.host.name for hp in others]


def gather(replies: Mapping, timeout: float) -> tuple[dict, dict[object, BaseException]]:
    """Wait for every reply until one deadline: (answers, errors) by the replies' keys."""
    deadline = time.monotonic() + timeout
    answers, errors = {}, {}
    for key, reply in replies.items():
        try:
            answers[key] = reply.wait(max(0.0, deadline - time.monotonic()))
        except StepFailed as exc:
            errors[key] = exc
    return answers, errors


def _empty_tar_gz() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz"):
        pass
    return buf.getvalue()
