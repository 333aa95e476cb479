"""Private key files loaded once per controller process (deploy/transport/keyfiles.py), from
the test keys of tests/unit/certificates: every login of a run uses the same key files, and an
RSA key costs some 85 ms of CPU to load. Pure: no login."""
from __future__ import annotations

import shutil
from pathlib import Path

import paramiko
import pytest

from deploy.transport import keyfiles
from deploy.transport.filecache import ParsedFiles

FILES = Path(__file__).parent / "certificates"


@pytest.fixture
def loads(monkeypatch):
    """The key files read and parsed, in order, with a cache of the test's own."""
    seen = []
    load = keyfiles._load
    monkeypatch.setattr(keyfiles, "_KEYS", ParsedFiles(
        lambda path, data, kind: seen.append((Path(path).name, kind.__name__)) or
        load(path, data, kind)))
    return seen


def test_a_key_file_is_loaded_once_for_every_login_until_its_bytes_change(tmp_path, loads):
    key = tmp_path / "id_ed25519"
    shutil.copy(FILES / "test_key", key)
    first = [keyfiles.private_key(str(key), paramiko.Ed25519Key) for _ in range(8)]
    assert loads == [("id_ed25519", "Ed25519Key")]
    assert len({k.get_fingerprint() for k in first}) == 1
    with key.open("a") as f:
        f.write("\n")                                     # the same key, other bytes
    assert keyfiles.private_key(str(key), paramiko.Ed25519Key).get_fingerprint() == \
        first[0].get_fingerprint()
    assert loads == [("id_ed25519", "Ed25519Key")] * 2
    shutil.copy(FILES / "other_key", key)                 # replaced by an RSA key
    with pytest.raises(paramiko.SSHException):
        keyfiles.private_key(str(key), paramiko.Ed25519Key)
    assert isinstance(keyfiles.private_key(str(key), paramiko.RSAKey), paramiko.RSAKey)


def test_each_caller_gets_a_copy_that_a_certificate_loaded_into_stays_in(tmp_path, loads):
    """paramiko loads the `<key>-cert.pub` beside a key into the key it was given: into a copy,
    so that a key file offered without it elsewhere is offered as the plain key."""
    shutil.copy(FILES / "test_key", tmp_path / "id_ed25519")
    shutil.copy(FILES / "alice-forever-cert.pub", tmp_path / "id_ed25519-cert.pub")
    load = keyfiles.key_from_file(lambda *args: pytest.fail("paramiko's own loader was used"))
    certified = load(str(tmp_path / "id_ed25519"), paramiko.Ed25519Key, None)
    assert certified.public_blob.key_type == "ssh-ed25519-cert-v01@openssh.com"
    named_by_certificate = load(str(tmp_path / "id_ed25519-cert.pub"), paramiko.Ed25519Key,
                                None)
    assert named_by_certificate.public_blob == certified.public_blob
    plain = keyfiles.private_key(str(tmp_path / "id_ed25519"), paramiko.Ed25519Key)
    assert plain.public_blob is None
    assert loads == [("id_ed25519", "Ed25519Key")]


def test_a_file_of_another_type_or_none_raises_as_paramiko_does(tmp_path, loads):
    assert isinstance(keyfiles.any_private_key(str(FILES / "test_key")), paramiko.Ed25519Key)
    with pytest.raises(paramiko.SSHException):
        keyfiles.private_key(str(FILES / "test_key"), paramiko.RSAKey)
    (tmp_path / "junk").write_bytes(b"\xff\xfe not a key\n")
    with pytest.raises(paramiko.SSHException):
        keyfiles.any_private_key(str(tmp_path / "junk"))
    with pytest.raises(OSError):
        keyfiles.private_key(str(tmp_path / "missing"), paramiko.Ed25519Key)


def test_with_a_password_paramikos_own_loader_loads_it():
    asked = []
    load = keyfiles.key_from_file(lambda *args: asked.append(args) or "paramiko's")
    assert load("/k", paramiko.RSAKey, "secret") == "paramiko's"
    assert asked == [("/k", paramiko.RSAKey, "secret")]
