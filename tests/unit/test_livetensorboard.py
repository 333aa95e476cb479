"""The live copy of the chief's TensorBoard logs: only new bytes packed on the host
(host/archive.py pack_tails), put in place here (run/livetensorboard.py apply_tails), names
from the host kept inside the copy. Pure: files in tmp_path, no host."""
from __future__ import annotations

import io
import os

import pytest

from deploy.host.archive import Limits, pack_tails, unpack
from deploy.host.protocol import ProtocolError, Tails
from deploy.run.livetensorboard import apply_tails, local_sizes


def sync(host, local, tmp_path, limits=Limits(1 << 20, 100)):
    """One fetch: the tails of `host` beyond `local`, unpacked in a staging directory, put."""
    body, offsets = pack_tails(str(host), local_sizes(local), limits)
    staging = tmp_path / f"staging-{len(os.listdir(tmp_path))}"
    staging.mkdir()
    if body:
        unpack(io.BytesIO(body), str(staging), limits)
    apply_tails(staging, local, offsets)
    return body, offsets


def test_only_new_bytes_travel_and_the_copy_equals_the_host(tmp_path):
    host, local = tmp_path / "host", tmp_path / "local"
    (host / "train").mkdir(parents=True)
    events = host / "train" / "events.out.tfevents.1"
    events.write_bytes(b"A" * 1000)
    body, offsets = sync(host, local, tmp_path)
    assert offsets == {"train/events.out.tfevents.1": 0}
    events.write_bytes(b"A" * 1000 + b"B" * 10)              # the writer appended an epoch
    (host / "validation").mkdir()
    (host / "validation" / "events.out.tfevents.2").write_bytes(b"V" * 5)
    body, offsets = sync(host, local, tmp_path)
    assert offsets == {"train/events.out.tfevents.1": 1000, "validation/events.out.tfevents.2": 0}
    assert len(body) < 400                                   # 15 new bytes, not 1,015
    assert local_sizes(local) == local_sizes(host)
    assert (local / "train" / "events.out.tfevents.1").read_bytes() == events.read_bytes()
    assert sync(host, local, tmp_path) == (b"", {})          # nothing new: nothing sent


def test_a_fetch_past_its_limits_leaves_the_rest_for_the_next(tmp_path):
    host, local = tmp_path / "host", tmp_path / "local"
    host.mkdir()
    for n in range(3):
        (host / f"f{n}").write_bytes(bytes([65 + n]) * 100)
    _, offsets = sync(host, local, tmp_path, Limits(150, 100))
    assert offsets == {"f0": 0, "f1": 0} and local_sizes(local) == {"f0": 100, "f1": 50}
    _, offsets = sync(host, local, tmp_path, Limits(150, 100))
    assert offsets == {"f1": 50, "f2": 0}
    assert local_sizes(local) == local_sizes(host)
    assert (local / "f1").read_bytes() == b"B" * 100


def test_a_file_that_shrank_on_the_host_comes_whole_and_links_are_not_followed(tmp_path):
    host, local = tmp_path / "host", tmp_path / "local"
    host.mkdir()
    (host / "f").write_bytes(b"x" * 50)
    sync(host, local, tmp_path)
    (host / "f").write_bytes(b"y" * 20)                      # replaced by a shorter file
    (tmp_path / "secret").write_bytes(b"not the run's")
    (host / "link").symlink_to(tmp_path / "secret")
    _, offsets = sync(host, local, tmp_path)
    assert offsets == {"f": 0} and (local / "f").read_bytes() == b"y" * 20
    assert not (local / "link").exists()


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", ".", ""])
def test_a_host_naming_a_piece_outside_the_copy_writes_nothing_there(tmp_path, name):
    staging, local = tmp_path / "staging", tmp_path / "run" / "tensorboard"
    (staging / "a").mkdir(parents=True)
    (staging / "escape").write_bytes(b"planted")
    (staging / "a" / "b").write_bytes(b"planted")
    apply_tails(staging, local, {name: 0})
    assert not (tmp_path / "run" / "escape").exists() and not (tmp_path / "b").exists()
    assert not local.exists() or local_sizes(local) == {}


def test_a_piece_that_does_not_start_where_the_copy_ends_waits(tmp_path):
    staging, local = tmp_path / "staging", tmp_path / "local"
    staging.mkdir()
    local.mkdir()
    (local / "f").write_bytes(b"12345")
    (staging / "f").write_bytes(b"zz")
    apply_tails(staging, local, {"f": 9})
    assert (local / "f").read_bytes() == b"12345"


def test_the_answer_is_typed():
    assert Tails.decode({"offsets": {"train/e": 10}}, "tail") == Tails({"train/e": 10})
    for bad in ({"offsets": {"e": -1}}, {"offsets": {"e": "10"}}, {"offsets": []}, {}):
        with pytest.raises(ProtocolError):
            Tails.decode(bad, "tail")
