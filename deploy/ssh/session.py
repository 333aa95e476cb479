"""The remote side of one run: every step on every host, over one transport per host.

Each method works on all hosts in parallel and waits for all of them, so a failure on one host
is reported together with what happened on the others.
"""
from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Mapping

from deploy.errors import Failure
from deploy.inventory.model import Host, Inventory
from deploy.plan.checks import HOSTCHECK_SOURCE
from deploy.plan.command import Command
from deploy.plan.planner import (
    HostPlan, RunPlan, cleanup_command, fetch_backup_command, fetch_output_command, framed,
    host_offsets, poll_command, replace_backup_command, stop_command
)
from deploy.plan.ports import choose_ports, task_ports
from deploy.ssh.parallel import HostsFailed, on_all, on_each
from deploy.ssh.transport import CommandResult, Exchange, Transport, connect


class StepFailed(Failure):
    """A step on a host answered with an error, or not as it must."""


def checked(result: CommandResult, host: Host, step: str) -> CommandResult:
    if result.code != 0:
        raise StepFailed(f"{host.label}: {step} failed: {result.error_text()}")
    return result


# An agent answers with one JSON object on its last line; past this size it is not an answer
# (the largest, a poll, carries at most 1 MiB of log per task, base64-encoded).
MAX_ANSWER_BYTES = 256 << 20


def agent_json(result: CommandResult, host: Host, step: str) -> dict:
    """The agent's answer: its last line as a JSON object, or StepFailed naming the host and
    quoting the first bytes of what came instead."""
    checked(result, host, step)
    lines = result.stdout.strip().splitlines()
    try:
        if not lines or len(lines[-1]) > MAX_ANSWER_BYTES:
            raise ValueError
        doc = json.loads(lines[-1])
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise StepFailed(f"{host.label}: {step}: unexpected answer "
                         f"{result.stdout[:200]!r}") from None
    return doc


def sharing(filesystems: Mapping[str, str | None]) -> dict[str, str]:
    """Hosts whose push answers name one filesystem (a workdir they share, deploy/host/share.py):
    follower name -> the first such host (in the given order), which alone is sent files."""
    first: dict[str, str] = {}
    followers = {}
    for name, fs in filesystems.items():
        if fs:
            leader = first.setdefault(fs, name)
            if leader != name:
                followers[name] = leader
    return followers


class Session:
    def __init__(self, transports: Mapping[str, Transport]):
        self.transports = dict(transports)

    @classmethod
    def open(cls, inventory: Inventory, connect_timeout: float,
             accept_new_host_keys: bool) -> "Session":
        results, errors = on_each(inventory.hosts, lambda h: h.name,
                                  lambda h: connect(h, connect_timeout, accept_new_host_keys))
        if errors:
            for transport in results.values():
                transport.close()
            raise HostsFailed("connecting", errors)
        return cls(results)

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def _each(self, plans, step: Callable[[HostPlan, Transport], object]):
        return on_each(plans, lambda hp: hp.host.name,
                       lambda hp: step(hp, self.transports[hp.host.name]))

    def _all(self, name: str, plans, step: Callable[[HostPlan, Transport], object]):
        return on_all(name, plans, lambda hp: hp.host.name,
                      lambda hp: step(hp, self.transports[hp.host.name]))

    def push(self, plans: list[HostPlan], what: str, command: Callable[[HostPlan], Command],
             stage: Callable[[HostPlan], bytes],
             content: Callable[[HostPlan, frozenset[str]], bytes | Iterable[bytes]],
             on_answers: Callable[[dict[str, dict]], None] = lambda answers: None,
             ) -> dict[str, dict]:
        """One command per host (planner.PUSH_BOOTSTRAP), in two steps: the host's stage (its
        helper and manifest; for the payload also small recent files) is answered with the
        file contents the host's cache still lacks; then, on the same stdin, exactly those
        travel and the host assembles the directory (a host that lacks nothing has done so, or
        had it, at its answer). `what` ("payload", "data") names the steps in errors. Returns
        each host's record: missing hashes, received (both steps), files.

        Hosts that share a workdir are sent the files once: the others wait for that push to
        end, then get an empty stream and find payload/ (or the cached files) there."""
        exchanges: dict[str, Exchange] = {}
        done = {hp.host.name: threading.Event() for hp in plans}
        filesystems: dict[str, str | None] = {}

        def ask(hp: HostPlan, t: Transport) -> dict:
            exchanges[hp.host.name] = exchange = t.exchange(command(hp).line, timeout=120)
            exchange.send(framed(stage(hp)))
            line = exchange.readline()
            if not line:                     # it ended without an answer: say why
                checked(exchange.finish(), hp.host, f"{what} push")
            answer = agent_json(CommandResult(0, line, b""), hp.host, f"{what} push")
            filesystems[hp.host.name] = answer.pop("filesystem", None)
            return answer

        def send(hp: HostPlan, t: Transport) -> dict:
            try:
                return send_files(hp)
            finally:
                done[hp.host.name].set()

        def send_files(hp: HostPlan) -> dict:
            want, exchange = wants[hp.host.name], exchanges[hp.host.name]
            if want.get("assembled") or want.get("present"):
                checked(exchange.finish(), hp.host, f"{what} push")
                return want
            exchange.settimeout(1800)
            leader = want.get("shared_with")
            if leader:
                done[leader].wait()
                exchange.send(content(hp, frozenset()))
                answer = agent_json(exchange.finish(), hp.host, f"sending {what} files")
                return {**answer, "missing": [], "received": [], "shared_with": leader}
            exchange.send(content(hp, frozenset(want["missing"])))
            answer = agent_json(exchange.finish(), hp.host, f"sending {what} files")
            return {**answer, "missing": want["missing"],
                    "received": want["received"] + answer["received"]}
        try:
            wants = self._all(f"pushing the {what}", plans, ask)
            for follower, leader in sharing({hp.host.name: filesystems.get(hp.host.name)
                                             for hp in plans}).items():
                wants[follower]["shared_with"] = leader
            on_answers(wants)
            return self._all(f"sending {what} files", plans, send)
        finally:
            for exchange in exchanges.values():
                exchange.close()

    def free_ports(self, plan: RunPlan) -> dict[int, int]:
        """A free port per task, distinct across the whole cluster: TensorFlow binds every
        interface, so two hosts that are one machine (a loopback lab) must not share one."""
        answers = self._all("choosing ports", plan.hosts, lambda hp, t: agent_json(
            t.run(hp.ports.line, stdin=HOSTCHECK_SOURCE.read_bytes(), timeout=60), hp.host,
            "port probe"))
        chosen = choose_ports([(hp.host, hp.host.cluster_tasks) for hp in plan.hosts],
                              {name: answer["ports"] for name, answer in answers.items()})
        return task_ports(plan.tasks, chosen)

    def launch(self, plan: RunPlan, attempt: int = 1, only: int | None = None) -> None:
        """Start every task (or the task of index `only`, relaunched in place)."""
        def start(hp: HostPlan, t: Transport) -> None:
            for task in hp.tasks:
                if only is not None and task.index != only:
                    continue
                # The attempt (1, then 2... under --restarts) also tells the agent to set the
                # previous attempt's files aside and mark the log.
                env = task.launch.env_stdin(TFDEPLOY_ATTEMPT=str(attempt))
                agent_json(t.run(task.launch.line, stdin=env, timeout=60),
                           hp.host, f"starting {task.name}")
        hosts = [hp for hp in plan.hosts if only is None or any(t.index == only for t in hp.tasks)]
        self._all("starting tasks", hosts, start)

    def poll(self, plan: RunPlan, offsets: Mapping[int, int]):
        """One answer per host: (answers by task index, errors by host name). Used for the
        last read of the logs after a stop; live following goes through follow.py."""
        def ask(hp: HostPlan, t: Transport) -> dict:
            mine = host_offsets(hp, offsets)
            return agent_json(t.run(poll_command(hp.host, hp.run_dir, mine).line, timeout=30),
                              hp.host, "poll")["tasks"]
        results, errors = self._each(plan.hosts, ask)
        answers = {}
        for host, tasks in results.items():
            keys = plan.by_key(host)
            answers.update({keys[k].index: doc for k, doc in tasks.items() if k in keys})
        return answers, errors

    def stop(self, plan: RunPlan) -> dict[str, str]:
        """TERM every task's process group, KILL after the grace period. Returns a problem per
        host: survivors, or no answer (nothing is assumed gone that was not seen gone)."""
        return self._ending(plan, lambda hp: stop_command(hp.host, hp.run_dir, plan.options.grace))

    def cleanup(self, plan: RunPlan) -> dict[str, str]:
        """Stop, then delete each host's run directory; problems by host, as for stop."""
        return self._ending(plan, lambda hp: cleanup_command(hp.host, hp.run_dir, plan.options.grace))

    def _ending(self, plan: RunPlan, command: Callable[[HostPlan], Command]) -> dict[str, str]:
        results, errors = self._each(plan.hosts, lambda hp, t: agent_json(
            t.run(command(hp).line, timeout=plan.options.grace + 60), hp.host, "teardown"))
        problems = {name: str(error) for name, error in errors.items()}
        for name, doc in results.items():
            if doc.get("survivors"):
                pids = ", ".join(map(str, doc["survivors"]))
                problems[name] = f"{name}: processes of the run still alive after SIGKILL: {pids}"
        return problems

    def fetch_output(self, plan: RunPlan, into: Path) -> int:
        """Copy the chief's TFDEPLOY_OUTPUT_DIR into `into`; return the number of files."""
        hp = plan.chief_host
        result = checked(self.transports[hp.host.name].run(
            fetch_output_command(hp.run_dir).line, timeout=600), hp.host, "fetching output")
        if not result.stdout:
            return 0
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:gz") as tar:
            tar.extractall(into, filter="data")
            return sum(1 for m in tar.getmembers() if m.isfile())

    def carry_backup(self, plan: RunPlan) -> int:
        """Copy the chief's TFDEPLOY_BACKUP_DIR over every other host's (no shared disk between
        bare machines; BackupAndRestore restores every worker from the chief's backup).
        Returns the size of the archive carried."""
        chief = plan.chief_host
        fetch = fetch_backup_command(chief.run_dir)
        data = checked(self.transports[chief.host.name].run(fetch.line, timeout=600), chief.host,
                       "fetching the backup").stdout or _empty_tar_gz()
        others = [hp for hp in plan.hosts if hp is not chief]
        self._all("carrying the backup", others, lambda hp, t: checked(
            t.run(replace_backup_command(hp.run_dir).line, stdin=data, timeout=600), hp.host,
            "replacing the backup"))
        return len(data)


def _empty_tar_gz() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz"):
        pass
    return buf.getvalue()
