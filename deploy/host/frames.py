"""The follow stream's framing: a JSON header line, then the raw log bytes it announces.

Log bytes travel as they are, never as base64 inside JSON: a flood of log lines then costs the
host one read and one write per chunk, and the controller one read, with no encoding, no
escaping and no per-line work on either side. A header is a JSON object; each task's status in
its "tasks" may carry "length", the number of that task's log bytes that follow the header
(in the order of the tasks in the header). The reader puts them back as the status's "data".
"""
import json

# A header is a few hundred bytes of task states; past this it is not a header.
MAX_HEADER = 1 << 20


def write_frame(out, doc, chunks=None):
    """Write `doc` and, for each task in chunks (task -> bytes), its bytes; `out` is a binary
    file. The header says the length of each task's bytes."""
    chunks = chunks or {}
    for task, data in chunks.items():
        doc["tasks"][task]["length"] = len(data)
    out.write(json.dumps(doc).encode() + b"\n")
    for task in doc.get("tasks", {}):
        if task in chunks:
            out.write(chunks[task])
    out.flush()


class FrameError(ValueError):
    """The stream holds something that is not a frame (a broken or foreign writer)."""


def read_frame(stream):
    """The next frame of `stream` (readline() and read(n) of a binary file) as a document
    whose task statuses carry their log bytes as "data"; None at the end of the stream."""
    line = stream.readline(MAX_HEADER)
    if not line:
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not line.endswith(b"\n"):
        raise FrameError("not a frame header: %r" % line[:200])
    for status in doc.get("tasks", {}).values():
        length = status.pop("length", 0)
        if not isinstance(length, int) or length < 0:
            raise FrameError("bad length in frame header: %r" % line[:200])
        data = stream.read(length) if length else b""
        if len(data) != length:
            raise FrameError("stream ended inside a frame (%d of %d bytes)" % (len(data), length))
        status["data"] = data
    return doc
