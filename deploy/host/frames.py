"""The framing of the channel between the controller and a host's agent (serve.py), both ways:
a JSON header line, then the raw bytes it announces.

Bytes travel as they are, never as base64 inside JSON: a flood of log lines then costs the host
one read and one write per chunk, and the controller one read, with no encoding, no escaping
and no per-line work on either side. A header is a JSON object. Each task's status in its
"tasks" may carry "length", the number of that task's log bytes that follow the header (in the
order of the tasks in the header); the reader puts them back as the status's "data". A
top-level "length" announces a body that follows the tasks' bytes; the reader puts it back as
"body".
"""
import json

# A header is a few hundred bytes of task states or a request's words; past this it is not a
# header. A task's log chunk is at most 256 KiB (agent.py); a body (a request's stage or backup,
# an answer's output archive) is bounded too, so that a broken or foreign writer cannot make
# the reader hold any amount of memory.
MAX_HEADER = 1 << 20
MAX_CHUNK = 16 << 20
MAX_BODY = 8 << 30


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
    """The stream holds something that is not a frame (a broken or foreign writer)."""


def _exactly(stream, length, line, most):
    if not isinstance(length, int) or not 0 <= length <= most:
        raise FrameError("bad length in frame header: %r" % line[:200])
    data = stream.read(length) if length else b""
    if len(data) != length:
        raise FrameError("stream ended inside a frame (%d of %d bytes)" % (len(data), length))
    return data


def read_frame(stream):
    """The next frame of `stream` (readline(limit) and read(n) of a binary file) as a
    document whose task statuses carry their log bytes as "data" and whose body is "body";
    None at the end of the stream."""
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
    for status in tasks.values():
        status["data"] = _exactly(stream, status.pop("length", 0), line, MAX_CHUNK)
    doc["body"] = _exactly(stream, doc.pop("length", 0), line, MAX_BODY)
    return doc
