"""The controller's memory of payload hashes: an unchanged file is not read again, any change
(even one that keeps size and mtime) is seen, and a just-written file is never remembered."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from deploy.push import hashcache
from deploy.push import payload as push_module
from deploy.push.hashcache import HashCache
from deploy.push.payload import PayloadPush


@pytest.fixture
def settled(monkeypatch):
    monkeypatch.setattr(hashcache, "SETTLE_NS", 0)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_an_unchanged_file_is_not_read_again(tmp_path, settled, monkeypatch):
    f = tmp_path / "a.bin"
    f.write_bytes(b"one")
    store = tmp_path / "hashes.json"
    first = HashCache(store)
    assert first.sha256(f)[0] == sha(b"one")
    first.save()

    def no_reading(path):
        raise AssertionError(f"{path} was read again")
    monkeypatch.setattr(hashcache, "file_sha256", no_reading)
    assert HashCache(store).sha256(f)[0] == sha(b"one")


def test_a_change_keeping_size_and_mtime_is_seen(tmp_path, settled):
    f = tmp_path / "a.bin"
    f.write_bytes(b"one")
    store = tmp_path / "hashes.json"
    cache = HashCache(store)
    cache.sha256(f)
    cache.save()
    st = f.stat()
    f.write_bytes(b"two")                                   # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))        # same mtime; ctime moves on
    assert HashCache(store).sha256(f)[0] == sha(b"two")


def test_a_file_written_just_now_is_not_remembered(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"fresh")
    cache = HashCache(tmp_path / "hashes.json")
    assert cache.sha256(f)[0] == sha(b"fresh")
    cache.save()
    assert HashCache(tmp_path / "hashes.json").known == {}


def test_a_broken_store_is_ignored_and_files_gone_drop_out(tmp_path, settled):
    store = tmp_path / "hashes.json"
    store.write_text("{not json")
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    cache = HashCache(store)
    cache.sha256(a)
    cache.sha256(b)
    cache.save()
    again = HashCache(store)
    again.sha256(a)
    again.save()
    assert list(HashCache(store).known) == [str(a)]


def test_only_changed_small_files_ride_along_with_the_manifest(tmp_path, settled, monkeypatch):
    monkeypatch.setattr(push_module, "INLINE_BYTES", 100)
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "train.py").write_text("print(1)\n")
    (payload / "big.bin").write_bytes(b"x" * 500)              # over the budget: never rides
    store = tmp_path / "hashes.json"
    first = PayloadPush(payload, "train.py", "r1", hash_cache=store)
    with tarfile.open(fileobj=io.BytesIO(first.stage)) as tar:      # new files: small ones
        assert [n for n in tar.getnames() if n.startswith("inline/")] == [
            "inline/" + sha(b"print(1)\n")]
    assert not store.exists()            # kept only once a push has reached every host
    first.hashes.save()                  # as PayloadPush.send does after such a push
    second = PayloadPush(payload, "train.py", "r2", hash_cache=store)
    with tarfile.open(fileobj=io.BytesIO(second.stage)) as tar:
        assert not [n for n in tar.getnames() if n.startswith("inline/")]   # nothing changed
    second.hashes.save()
    (payload / "train.py").write_text("print(2)\n")
    third = PayloadPush(payload, "train.py", "r3", hash_cache=store)
    with tarfile.open(fileobj=io.BytesIO(third.stage)) as tar:
        inline = [n for n in tar.getnames() if n.startswith("inline/")]
        assert inline == ["inline/" + sha(b"print(2)\n")]
        assert tar.extractfile(inline[0]).read() == b"print(2)\n"
