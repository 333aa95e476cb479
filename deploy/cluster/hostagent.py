"""The controller's end of a host's agent (deploy/host/tasks.py): one Python started once per
host per run on one channel of the host's transport, asked every later step as a request.

Requests are sent without waiting for earlier answers: asking every host, then collecting the
answers, costs one round trip for all of them, and a host's step costs a round trip, not a
login, a shell and a Python start. A reader thread per agent sorts the answers by request id
and notes when the host was last heard (the agent beats every second even when idle).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import threading
import time
from typing import BinaryIO, Callable, Iterable, Union

import deploy.host.boot
from deploy.errors import Failure
from deploy.host.frames import HEADER_ONLY, PIECE, Bounds, FrameError, read_frame
from deploy.host.layout import agent_code_dir
from deploy.host.protocol import (
    LOG_CHUNK, Answer, Beat, FollowRequest, PollRequest, ProtocolError, error_of
)
from deploy.inventory.model import Host
from deploy.plan.command import Request
from deploy.plan.planner import agent_command
from deploy.cluster.hostcode import host_sources
from deploy.transport.base import LineStream, Transport, TransportError


class StepFailed(Failure):
    """A step on a host answered with an error, or not in time, or not as it must."""


# What goes with a request: bytes, or a file (a backup carried between hosts), sent in pieces.
Body = Union[bytes, BinaryIO]


def body_size(body: Body) -> int:
    return len(body) if isinstance(body, (bytes, bytearray)) else os.fstat(body.fileno()).st_size


def body_pieces(body: Body, size: int) -> Iterable[bytes]:
    if isinstance(body, (bytes, bytearray)):
        if size:
            yield body
        return
    for offset in range(0, size, PIECE):
        yield os.pread(body.fileno(), min(PIECE, size - offset), offset)


def answer_bounds(request: Request, into=None) -> Bounds:
    """What an answer to `request` may carry (frames.py): log bytes of the tasks it asks
    about, at most one chunk each (poll, follow); a body only where it is an archive, and
    then into a file (`into`, with its `limit`), never memory; else the header alone."""
    if isinstance(request.message, (PollRequest, FollowRequest)):
        return Bounds(tasks=frozenset(request.message.offsets), chunk=LOG_CHUNK)
    if into is not None:
        return Bounds(body=into.limit, into=into)
    return HEADER_ONLY


@functools.lru_cache(maxsize=1)
def _boot_and_package() -> bytes:
    boot = inspect.getsource(deploy.host.boot).encode()
    package = host_sources()
    return b"%d\n" % len(boot) + boot + b"%d\n" % len(package) + package


def boot_stdin(workdir: str) -> bytes:
    """What the agent's python reads first (planner.agent_command): boot.py, which loads the
    host package from memory, then the package, then where the host keeps its compiled code
    (in the cache of `workdir`), each headed by its length. The first two are made once per
    controller, however many hosts."""
    folder = agent_code_dir(workdir).encode("utf-8")
    return _boot_and_package() + b"%d\n" % len(folder) + folder


class Reply:
    """A request's answer, when it comes, typed by its verb (deploy/host/protocol.py). A
    request answered by many frames (a follow) hands each to `on_frame` until one says "end";
    `on_end`, if given, is called with the reply once it has ended (answered, failed or
    lost)."""

    def __init__(self, agent: "HostAgent", step: str, request: Request,
                 on_frame: Callable[[Answer], None] | None = None,
                 on_end: Callable[["Reply"], None] | None = None, into=None):
        self.agent, self.step, self.on_frame, self.on_end = agent, step, on_frame, on_end
        self.verb, self.answer_type = request.verb, request.message.answer
        self.bounds = answer_bounds(request, into)
        self.done = threading.Event()
        self.answer: Answer | None = None
        self.error = ""
        self.broken = False      # the host answered what its verb does not (protocol.py)
        self.number = 0          # its request's id on the agent's channel
        self.stream: LineStream | None = None    # that channel

    def wait(self, timeout: float) -> Answer:
        """The answer; StepFailed naming the host, the step and how long it waited when none
        came in `timeout` seconds, or when the host answered with an error."""
        if not self.done.wait(timeout):
            raise StepFailed(f"{self.agent.host.label}: {self.step}: no answer after "
                             f"{timeout:g} s; abandoned")
        if self.error and self.error == self.agent.lost:     # the agent itself is gone
            raise StepFailed(f"{self.agent.host.label}: {self.error} (during: {self.step})")
        if self.error:
            raise StepFailed(f"{self.agent.host.label}: {self.step} failed: {self.error}")
        return self.answer

    def _end(self, answer: Answer | None, error: str = "") -> None:
        if self.done.is_set():
            return                # answered before its channel was given up on
        self.answer, self.error = answer, error
        self.done.set()
        if self.on_end is not None:
            self.on_end(self)


class HostAgent:
    def __init__(self, host: Host, transport: Transport):
        self.host, self.transport = host, transport
        self.ids = itertools.count(1)
        self.sending = threading.Lock()       # one frame at a time on the channel
        self.table = threading.Lock()         # the replies awaited
        self.lost = ""                        # why the channel ended, once it has
        # The host's GPUs as its beats last sampled them: index -> (utilisation %, MiB used).
        self.gpu_sample: dict[str, tuple[int | None, int | None]] = {}
        self._start()

    def _start(self) -> None:
        """Start the agent on a channel of its own, with a reader for its answers."""
        self.stream: LineStream = self.transport.stream(agent_command(self.host).line)
        self.replies: dict[int, Reply] = {}
        self.heard = time.monotonic()
        self.up = threading.Event()           # it said something, or its channel ended
        try:
            self.stream.send(boot_stdin(self.host.workdir))
        except TransportError:
            pass        # it ended before it read (no python there): its reader says why
        threading.Thread(target=self._read, args=(self.stream, self.replies), daemon=True,
                         name=f"agent-{self.host.name}").start()

    def ask(self, request: Request, step: str, body: Body = b"",
            files: Iterable[bytes] | None = None,
            on_frame: Callable[[Answer], None] | None = None,
            on_end: Callable[[Reply], None] | None = None, into=None, **env: str) -> Reply:
        """Send `request` (with `body`, or followed by the stream `files`) and return its
        Reply at once. `into`: where the answer's body (an archive) goes (session.py
        BodyFile); an answer to any other request carries none."""
        reply = Reply(self, step, request, on_frame, on_end, into)
        header = request.wire(**env)
        size = body_size(body)
        if size:
            header["length"] = size
        with self.sending:
            with self.table:
                header["id"] = reply.number = next(self.ids)
                reply.stream = self.stream
                self.replies[reply.number] = reply
                lost = self.lost
            if lost:
                return self._forget(reply, lost)
            try:
                self.stream.send(json.dumps(header).encode() + b"\n")
                for piece in body_pieces(body, size):
                    self.stream.send(piece)
            except TransportError as exc:
                # The channel closed under it: its reader is about to tell why (the agent's
                # exit and last words), which says more than a broken pipe.
                if not reply.done.wait(2):
                    self._forget(reply, str(exc))
                return reply
            try:
                for piece in files or ():
                    self.stream.send(piece)
            except Exception as exc:
                # The files stopped going: the host failed their request (its answer says
                # why: a full disk) and left, or they stopped coming (a file changed while it
                # was read). Either way nothing more can go on this channel: a new agent
                # takes its place for what follows (the teardown).
                reply.done.wait(2)       # the host's answer says why, when it gave one
                self.restart(reply.error or f"its file stream was cut: {exc}")
                if not isinstance(exc, TransportError):
                    raise
        return reply

    def resync(self, reply: Reply) -> None:
        """After a request with files that failed: the host may not have read them to their
        end (and an agent that failed them stops reading), so a new agent takes over, unless
        one already has."""
        if reply.stream is self.stream:
            self.restart(reply.error or "its file stream failed")

    def restart(self, why: str) -> None:
        """A new agent on a new channel in place of this one, whose awaited answers fail with
        `why`: after a file stream the host did not read to its end, what follows it on the
        channel would be read as requests."""
        with self.table:
            replies, stream = self.replies, self.stream
        try:
            self._start()        # first: the old channel's reader must find itself replaced
            self.lost = ""       # the old agent's end (it stops at failed files) is not the host's
        except TransportError as exc:
            self.lost = str(exc)
        self._fail(replies, why)
        stream.close()

    def wait_started(self, timeout: float) -> None:
        """Wait for the agent's first word (a beat, sent as it starts serving): an agent that
        cannot start (no such python, one too old) is named at login, before anything of a run
        is written anywhere, not at its first step. One still silent after `timeout` is left
        to its steps' own deadlines."""
        self.up.wait(timeout)
        if self.lost:
            raise StepFailed(f"{self.host.label}: {self.lost}")

    def tell(self, request: Request) -> None:
        """Send a request that is not answered (a follow's credit); a lost channel is noticed
        by the reader."""
        with self.sending:
            try:
                self.stream.send(json.dumps(request.wire()).encode() + b"\n")
            except TransportError:
                pass

    def _forget(self, reply: Reply, why: str) -> Reply:
        with self.table:
            self.replies.pop(reply.number, None)
        reply._end(None, why)
        return reply

    def silent_for(self) -> float:
        """Seconds since the host last said anything (a beat at least every second)."""
        return time.monotonic() - self.heard

    def _read(self, stream: LineStream, replies: dict[int, Reply]) -> None:
        def bounds(doc: dict) -> Bounds:
            """What the frame may carry: what its request's answer may (frames.py)."""
            number = doc.get("id")
            if isinstance(number, bool) or not isinstance(number, int):
                return HEADER_ONLY
            with self.table:
                reply = replies.get(number)
            return HEADER_ONLY if reply is None else reply.bounds
        try:
            while (doc := read_frame(stream, bounds)) is not None:
                self.heard = time.monotonic()
                self.up.set()
                number = doc.pop("id", None)
                del doc["body"]          # answers carry none in memory (answer_bounds)
                if number is None:
                    beat = Beat.decode(doc)
                    if beat.gpus:
                        self.gpu_sample = beat.gpus
                    continue
                with self.table:
                    reply = replies.get(number)
                if reply is not None:
                    self._answer(replies, reply, doc)
            why = self._ended(stream)
        except (FrameError, ProtocolError) as exc:
            # A host that breaks the protocol is not listened to any more: what it sends
            # next could be anything.
            why = f"{exc}"
            stream.close()
        except Exception as exc:  # a broken channel or garbage: every waiting step is told
            why = f"{exc}"
        if stream is self.stream:
            self._fail_all(why)
            self.up.set()
        else:                     # a channel given up on (restart): its replies are told
            self._fail(replies, why)

    def _answer(self, replies: dict[int, Reply], reply: Reply, doc: dict) -> None:
        """One frame for `reply`: checked against its verb's answer type; an answer that does
        not fit fails the reply, naming the field (the channel goes on: the frame was read
        whole). A reply of many frames (a follow) that failed stays known, so that what it
        still sends is read within its bounds, and dropped."""
        try:
            error = error_of(doc, reply.verb)
            answer = None if error is not None else reply.answer_type.decode(
                doc, reply.verb)
            bad = False
        except ProtocolError as exc:
            error, answer, bad = str(exc), None, True
            reply.broken = True
        final = error is not None or reply.on_frame is None or getattr(answer, "end", False)
        if final and not (bad and reply.on_frame is not None):
            with self.table:
                replies.pop(reply.number, None)
        if reply.done.is_set():
            return
        if not final:
            reply.on_frame(answer)
            return
        reply._end(answer, error or "")

    def _ended(self, stream: LineStream) -> str:
        """Why the agent's channel ended: its python's exit and last words."""
        result = stream.outcome()
        if result.code in (126, 127):
            return (f"python {self.host.python!r} does not run there: {result.error_text()} "
                    f"(set 'python:' in the inventory)")
        if result.code == deploy.host.boot.TOO_OLD or (
                result.code == 2 and b"Unknown option: -I" in result.stderr):
            oldest = ".".join(map(str, deploy.host.boot.OLDEST_PYTHON))
            why = (result.error_text() if result.code == deploy.host.boot.TOO_OLD else
                   f"{self.host.python} is Python 2; tfdeploy's host agent needs Python "
                   f"{oldest} or newer")
            return f"{why}: set 'python:' in the inventory to a newer interpreter"
        if result.code < 0:
            return "the connection was lost"
        return f"the host's agent ended ({result.error_text()})"

    def _fail(self, replies: dict[int, Reply], why: str) -> None:
        with self.table:
            pending = list(replies.values())
            replies.clear()
        for reply in pending:
            reply._end(None, why)

    def _fail_all(self, why: str) -> None:
        with self.table:
            self.lost = self.lost or why or "the host's agent ended"
        self._fail(self.replies, self.lost)

    def abandon(self, why: str) -> None:
        """Give up on the host: every awaited answer and every later request fails at once
        with `why`, and the channel is dropped."""
        self._fail_all(why)
        self.close()

    def close(self) -> None:
        try:
            self.stream.close()
        except Exception:  # closing a broken channel may fail; it is being dropped
            pass

