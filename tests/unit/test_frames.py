"""The follow stream's frames: any log bytes, in any number of frames, come out as they went in."""
from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.host.frames import FrameError, read_frame, write_frame


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
    assert read_frame(stream) == {"tasks": {"0": {"state": "exited", "code": 0, "data": b""}}}
    assert read_frame(stream) == {"stopped": {"signalled": {}, "survivors": []}}


@pytest.mark.parametrize("stream, message", [
    (b"not json\n", "not a frame header"),
    (b'["a list"]\n', "not a frame header"),
    (b'{"tasks": {"0": {"length": 10}}}\nshort', "stream ended inside a frame"),
    (b'{"tasks": {"0": {"length": -1}}}\n', "bad length"),
    (b'{"tasks": {}}', "not a frame header"),          # cut before its newline
])
def test_what_is_not_a_frame_is_refused(stream, message):
    with pytest.raises(FrameError, match=message):
        read_frame(io.BytesIO(stream))
