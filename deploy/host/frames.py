"""The framing of the channel between the controller and a host's agent (agent.py), both ways:
a JSON header line, then the raw bytes it announces.

Bytes travel as they are, never as base64 inside JSON: a flood of log lines then costs the host
one read and one write per chunk, and the controller one read, with no encoding, no escaping
and no per-line work on either side. A header is a JSON object. Each task's status in its
"tasks" may carry "length", the number of that task's log bytes that follow the header (in the
order of the tasks in the header); the reader puts them back as the status's "data". A
top-level "length" announces a body that follows the tasks' bytes; the reader puts it back as
"body".
"""
from __future__ import annotations

import json

from deploy.host.records import Frozen, record

# Names the annotations use: never evaluated, and a host's agent does not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

# A header is a few hundred bytes of task states or a request's words; past this it is not a
# header. A request's body (a stage, a backup) comes from the controller; an answer's body and
# log chunks are bounded by what the request asked for (Bounds), so that a broken or foreign
# writer cannot make the reader hold any amount of memory.
MAX_HEADER = 1 << 20
MAX_CHUNK = 16 << 20
MAX_BODY = 8 << 30
# A body handed on to a file is read in pieces of this.
PIECE = 1 << 20


@record
class Bounds(Frozen):
    """What a frame may carry: log bytes for the tasks named (`tasks`, at most `chunk` bytes
    each; any other task is refused before its bytes are read) and a body of at most `body`
    bytes. With `into` (begin(length), write(piece): a file on disk) the body goes there in
    pieces instead of memory."""
    tasks: Optional[frozenset] = frozenset()      # None: any task
    chunk: int = 0
    body: int = 0
    into: Any = None


# What the agent reads from the controller: requests, their stage or backup as a body.
REQUESTS = Bounds(tasks=None, chunk=MAX_CHUNK, body=MAX_BODY)
# A frame that may carry nothing but its header: a beat, an answer of a few fields.
HEADER_ONLY = Bounds()


def write_frame(out, doc, chunks=None, body=b""):
    """Write `doc`, then for each task in chunks (task -> bytes) its bytes, then `body`; `out`
    is a binary file. The header says the length of each."""
    chunks = chunks or {}
    for task, data in chunks.items():
        doc["tasks"][task]["length"] = len(data)
    if body:
        doc["length"] = len(body)
    out.write(json.dumps(doc).encode() + b"\n")
    for task in doc.get("tasks", {}):
        if task in chunks:
            out.write(chunks[task])
    if body:
        out.write(body)
    out.flush()


class FrameError(ValueError):
    """The stream holds something that is not a frame (a broken or foreign writer), or a frame
    that carries more than its bounds allow."""


def _length(value, line, most, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FrameError("bad length in frame header: %r" % line[:200])
    if value > most:
        raise FrameError("bad length in frame header: %s of %d bytes, more than the %d "
                         "allowed: %r" % (what, value, most, line[:200]))
    return value


def _exactly(stream, length):
    data = stream.read(length) if length else b""
    if len(data) != length:
        raise FrameError("stream ended inside a frame (%d of %d bytes)" % (len(data), length))
    return data


def _hand_on(stream, length, into):
    """Read `length` bytes of `stream` in pieces into `into`; memory stays one piece."""
    into.begin(length)
    left = length
    while left:
        piece = stream.read(min(PIECE, left))
        if not piece:
            raise FrameError("stream ended inside a frame (%d of %d bytes)" % (
                length - left, length))
        into.write(piece)
        left -= len(piece)


def read_frame(stream, bounds=lambda doc: REQUESTS):
    """The next frame of `stream` (readline(limit) and read(n) of a binary file) as a
    document whose task statuses carry their log bytes as "data" and whose body is "body";
    None at the end of the stream. `bounds(doc)` says what this frame may carry, from its
    header (the request it answers): FrameError, before any of its bytes are read, for a
    length past them or a task it does not name."""
    line = stream.readline(MAX_HEADER)
    if not line:
        return None
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict) or not line.endswith(b"\n"):
        raise FrameError("not a frame header: %r" % line[:200])
    tasks = doc.get("tasks", {})
    if not isinstance(tasks, dict) or not all(isinstance(s, dict) for s in tasks.values()):
        raise FrameError("bad tasks in frame header: %r" % line[:200])
    limits = bounds(doc)
    unasked = [t for t in tasks if limits.tasks is not None and t not in limits.tasks]
    if unasked:
        raise FrameError("a frame about task %r, which was not asked about: %r" % (
            unasked[0], line[:200]))
    lengths = [_length(s.pop("length", 0), line, limits.chunk, "log bytes")
               for s in tasks.values()]
    body = _length(doc.pop("length", 0), line, limits.body, "a body")
    for status, length in zip(tasks.values(), lengths):
        status["data"] = _exactly(stream, length)
    if limits.into is not None and body:
        _hand_on(stream, body, limits.into)
        doc["body"] = b""
    else:
        doc["body"] = _exactly(stream, body)
    return doc
