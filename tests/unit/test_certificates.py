"""OpenSSH user certificates read as ssh reads them (deploy/transport/certificates.py), from
files ssh-keygen made (tests/unit/certificates: test keys and certificates of a throwaway CA
that no host trusts). Pure: no login."""
from __future__ import annotations

import calendar
import shutil
from pathlib import Path

import pytest

from deploy.transport.certificates import certified_key, read_certificate, refusal

FILES = Path(__file__).parent / "certificates"


def at(date: str) -> float:
    return calendar.timegm(tuple(map(int, date.split("-"))) + (0, 0, 0))


def test_a_certificates_principals_and_validity():
    forever = read_certificate(str(FILES / "alice-forever-cert.pub"))
    assert forever.principals == ("alice", "ops") and forever.user_certificate
    assert forever.valid_after == 0 and forever.valid_before == 2 ** 64 - 1
    dated = read_certificate(str(FILES / "alice-2020-cert.pub"))
    assert (dated.valid_after, dated.valid_before) == (at("2020-01-01"), at("2020-01-02"))
    assert read_certificate(str(FILES / "anyone-2030-cert.pub")).principals == ()


@pytest.mark.parametrize("name, user, now, why", [
    ("alice-forever-cert.pub", "alice", "2026-12-04", None),
    ("alice-forever-cert.pub", "root", "2026-12-04", "is for 'alice', 'ops', not 'root'"),
    ("alice-2020-cert.pub", "alice", "2026-12-04", "expired at 2020-01-02 00:00:00 UTC"),
    ("alice-2020-cert.pub", "alice", "2020-01-01", None),
    ("anyone-2030-cert.pub", "root", "2026-12-04", "is not valid before 2030-01-01 00:00:00 UTC"),
    ("host-cert.pub", "alice", "2026-12-04", "is a host certificate, not a user's"),
])
def test_why_a_host_would_refuse_it(name, user, now, why):
    certificate = read_certificate(str(FILES / name))
    said = certificate.problem(user, at(now))
    assert said == (why and f"certificate {FILES / name} {why}")


def test_a_key_is_no_certificate_and_a_missing_file_is_said():
    with pytest.raises(ValueError, match=f"cannot read certificate {FILES}/missing.pub"):
        read_certificate(str(FILES / "missing.pub"))
    with pytest.raises(ValueError, match="test_key"):
        read_certificate(str(FILES / "test_key"))        # a private key


def test_a_certificate_file_is_paired_with_the_key_it_certifies_wherever_each_lies(tmp_path):
    """ssh offers a CertificateFile with the identity whose public key it certifies: here the
    second key file, not the first; a certificate of another key pairs with none."""
    key, certificate = FILES / "test_key", FILES / "alice-forever-cert.pub"
    paired, read = certified_key((str(certificate),), [str(FILES / "other_key"), str(key)])
    assert paired is not None and paired.public_blob.key_type == \
        "ssh-ed25519-cert-v01@openssh.com"
    assert paired.public_blob == read_certificate(str(certificate)).blob
    assert [c.path for c in read] == [str(certificate)]
    unpaired, _ = certified_key((str(FILES / "anyone-2030-cert.pub"),), [str(key)])
    assert unpaired is None


def test_refusal_names_each_certificate_offered_beside_its_key(tmp_path):
    """A `<key>-cert.pub` beside a key file (paramiko offers it) is read for the reasons too."""
    shutil.copy(FILES / "test_key", tmp_path / "id_ed25519")
    shutil.copy(FILES / "alice-2020-cert.pub", tmp_path / "id_ed25519-cert.pub")
    paired, read = certified_key((), [str(tmp_path / "id_ed25519")])
    assert paired is None                       # nothing configured: paramiko pairs it itself
    assert refusal(read, "alice") == (f"certificate {tmp_path}/id_ed25519-cert.pub expired at "
                                      f"2020-01-02 00:00:00 UTC")
