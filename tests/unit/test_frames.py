"""The frames of the agents' channel: any log bytes and bodies, in any number of frames, come
out as they went in."""
from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.host.frames import MAX_BODY, MAX_CHUNK, FrameError, read_frame, write_frame


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["0", "1", "7"]), st.binary(max_size=300),
                                max_size=3), max_size=6))
def test_frames_carry_any_bytes_in_order(frames):
    out = io.BytesIO()
    for chunks in frames:
        doc = {"tasks": {task: {"state": "running", "offset": len(data)}
                         for task, data in chunks.items()}}
        write_frame(out, doc, chunks)
    stream = io.BytesIO(out.getvalue())
    for chunks in frames:
        doc = read_frame(stream)
        assert {task: status["data"] for task, status in doc["tasks"].items()} == chunks
        assert all(status["state"] == "running" for status in doc["tasks"].values())
    assert read_frame(stream) is None


def test_a_frame_without_bytes_and_a_stop_answer():
    out = io.BytesIO()
    write_frame(out, {"tasks": {"0": {"state": "exited", "code": 0}}})
    write_frame(out, {"stopped": {"signalled": {}, "survivors": []}})
    stream = io.BytesIO(out.getvalue())
    assert read_frame(stream) == {"tasks": {"0": {"state": "exited", "code": 0, "data": b""}},
                                  "body": b""}
    assert read_frame(stream) == {"stopped": {"signalled": {}, "survivors": []}, "body": b""}


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=2000), st.dictionaries(st.sampled_from(["0", "1"]),
                                                 st.binary(max_size=300), max_size=2))
def test_a_body_follows_the_tasks_bytes_and_comes_back_as_it_went(body, chunks):
    """A request's or an answer's body (a stage, a tar.gz): announced by a top-level "length",
    after the tasks' bytes; read back as "body"."""
    out = io.BytesIO()
    doc = {"id": 3, "tasks": {task: {"state": "running"} for task in chunks}}
    write_frame(out, doc, chunks, body)
    write_frame(out, {"id": 4, "verb": "poll"})
    header = json.loads(out.getvalue().split(b"\n", 1)[0])
    assert header.get("length", 0) == len(body)
    stream = io.BytesIO(out.getvalue())
    first = read_frame(stream)
    assert first["body"] == body and first["id"] == 3 and "length" not in first
    assert {task: status["data"] for task, status in first["tasks"].items()} == chunks
    assert read_frame(stream) == {"id": 4, "verb": "poll", "body": b""}
    assert read_frame(stream) is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=500))
def test_any_bytes_are_a_frame_or_refused_as_none(data):
    """Whatever comes on the channel: a document, the end, or FrameError; nothing else."""
    stream = io.BytesIO(data)
    try:
        while read_frame(stream) is not None:
            pass
    except FrameError:
        pass


@pytest.mark.parametrize("stream, message", [
    (b"not json\n", "not a frame header"),
    (b'["a list"]\n', "not a frame header"),
    (b'{"tasks": {"0": {"length": 10}}}\nshort', "stream ended inside a frame"),
    (b'{"tasks": {"0": {"length": -1}}}\n', "bad length"),
    (b'{"tasks": {}}', "not a frame header"),          # cut before its newline
    (b'{"length": 10}\nshort', "stream ended inside a frame"),
    (b'{"length": "10"}\n', "bad length"),
    (b'{"tasks": []}\n', "bad tasks"),
    (b"[" * 100000 + b"]" * 100000 + b"\n", "not a frame header"),    # nested past recursion
    # Lengths past any chunk or body the tools send: refused before anything is read.
    (b'{"tasks": {"0": {"length": %d}}}\n' % (MAX_CHUNK + 1), "bad length"),
    (b'{"length": %d}\n' % (MAX_BODY + 1), "bad length"),
    (b'{"length": 1e400}\n', "bad length"),
])
def test_what_is_not_a_frame_is_refused(stream, message):
    with pytest.raises(FrameError, match=message):
        read_frame(io.BytesIO(stream))
