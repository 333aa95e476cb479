"""known_hosts read as OpenSSH reads it: hashed names, negation and wildcards, @revoked and
@cert-authority lines, every file in order; accept-new writes only when asked."""
from __future__ import annotations

import base64
import hashlib
import hmac

import paramiko
import pytest

from deploy.inventory.sshconfig import Hop
from deploy.transport import hostkeys
from deploy.transport.filecache import ParsedFiles



@pytest.fixture(scope="module")
def keys():
    return [paramiko.ECDSAKey.generate() for _ in range(2)]


def line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{names} {key.get_name()} {key.get_base64()}\n"


def hashed(name: str) -> str:
    salt = b"0123456789abcdefghij"
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def check(tmp_path, text: str, key, hop=Hop("a", "10.0.0.5", 2222), accept_new=False,
          second: str = ""):
    first, other = tmp_path / "known_hosts", tmp_path / "known_hosts2"
    first.write_text(text)
    other.write_text(second)
    policy = hostkeys.OpenSshCheck("a", hop, (str(first), str(other)), accept_new)
    policy.missing_host_key(None, "ignored", key)
    return first.read_text()


@pytest.mark.parametrize("names", ["[10.0.0.5]:2222", "[10.0.0.*]:2222", "x,[10.0.0.5]:2222",
                                   hashed("[10.0.0.5]:2222")])
def test_a_known_key_passes_and_nothing_is_written(tmp_path, keys, names):
    text = line(names, keys[0])
    assert check(tmp_path, text, keys[0]) == text


def test_the_second_file_is_read_and_the_alias_is_the_name(tmp_path, keys):
    assert check(tmp_path, "", keys[0], second=line("[10.0.0.5]:2222", keys[0])) == ""
    alias = Hop("a", "10.0.0.5", 2222, host_key_alias="gce.123")
    assert check(tmp_path, line("gce.123", keys[0]), keys[0], hop=alias)
    with pytest.raises(hostkeys.HostKeyRefused, match="looked up as gce.123"):
        check(tmp_path, line("[10.0.0.5]:2222", keys[0]), keys[0], hop=alias)


@pytest.mark.parametrize("text, words", [
    ("![10.0.0.5]:2222,[10.0.0.*]:2222 {k0}", "host key not in"),   # negated
    ("[10.0.0.5]:2222 {k1}", "HOST KEY CHANGED for [10.0.0.5]:2222: {kh}:1 has"),
    ("@revoked [10.0.0.5]:2222 {k0}", "REVOKED ({kh}:1)"),
    ("@cert-authority [10.0.0.*]:2222 {k1}", "trusts a certificate authority"),
    ("@cert-authority [10.0.0.*]:2222 {k1}", "with: ssh-keyscan -p 2222 10.0.0.5 >> {kh}"),
])
def test_what_is_refused(tmp_path, keys, text, words):
    k0, k1 = (f"{k.get_name()} {k.get_base64()}" for k in keys)
    with pytest.raises(hostkeys.HostKeyRefused) as caught:
        check(tmp_path, text.format(k0=k0, k1=k1) + "\n", keys[0])
    assert words.format(kh=tmp_path / "known_hosts") in str(caught.value)


def test_accept_new_writes_the_first_file_and_only_then(tmp_path, keys):
    with pytest.raises(hostkeys.HostKeyRefused):
        check(tmp_path, "", keys[0])
    assert (tmp_path / "known_hosts").read_text() == ""
    written = check(tmp_path, "", keys[0], accept_new=True)
    assert written == line("[10.0.0.5]:2222", keys[0])


def test_a_file_is_parsed_once_for_every_host_until_its_bytes_change(tmp_path, keys,
                                                                      monkeypatch):
    """Every login of a run looks itself up in the same files: each is parsed once, and again
    only when it changed (a key accepted meanwhile, a line edited to the same length)."""
    parsed = []
    parse = hostkeys._parse
    monkeypatch.setattr(hostkeys, "_PARSED", ParsedFiles(
        lambda file, data: parsed.append(file) or parse(file, data)))
    known = tmp_path / "known_hosts"
    known.write_text(line(hashed("[10.0.0.5]:2222"), keys[0]) + line("[10.0.0.6]:2222", keys[1]))
    for host, key in (("10.0.0.5", keys[0]), ("10.0.0.6", keys[1])):
        hostkeys.OpenSshCheck("a", Hop("a", host, 2222), (str(known),), False) \
            .missing_host_key(None, "ignored", key)
    assert parsed == [str(known)]
    known.write_text(line("[10.0.0.6]:2222", keys[0]) + line(hashed("[10.0.0.5]:2222"), keys[1]))
    with pytest.raises(hostkeys.HostKeyRefused, match="HOST KEY CHANGED"):
        hostkeys.OpenSshCheck("a", Hop("a", "10.0.0.6", 2222), (str(known),), False) \
            .missing_host_key(None, "ignored", keys[1])
    assert parsed == [str(known)] * 2
