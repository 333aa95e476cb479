"""The bytes pushed to every host: payload, agent and run identity, as one tar.gz."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from deploy.bundle import AGENT_SOURCE, BundleError, build_bundle, payload_files

RUN_ID = "20260101-000000-b0b0b0"


def members(bundle: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def read(bundle: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return tar.extractfile(name).read()


@pytest.fixture
def payload(tmp_path):
    root = tmp_path / "payload"
    for d in ("pkg/__pycache__", "pkg/deep/er", ".git/objects", "nb/.ipynb_checkpoints"):
        (root / d).mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "deep" / "er" / "data file.csv").write_text("a,b\n1,2\n")
    (root / "pkg" / "__pycache__" / "util.cpython-311.pyc").write_bytes(b"\0")
    (root / "pkg" / "stray.pyc").write_bytes(b"\0")
    (root / ".git" / "objects" / "ab").write_bytes(b"git")
    (root / "nb" / "a.ipynb").write_text("{}")
    (root / "nb" / ".ipynb_checkpoints" / "a-checkpoint.ipynb").write_text("{}")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_bundle_holds_payload_agent_and_identity(payload):
    bundle = build_bundle(payload, "train.py", RUN_ID)
    assert bundle[:2] == b"\x1f\x8b"                       # gzip
    found = members(bundle)
    assert sorted(found) == ["payload/nb/a.ipynb", "payload/pkg/__init__.py",
                             "payload/pkg/deep/er/data file.csv", "payload/pkg/util.py",
                             "payload/run.sh", "payload/train.py", "run.json",
                             "tfdeploy_agent.py"]
    assert json.loads(read(bundle, "run.json")) == {"run_id": RUN_ID}
    assert read(bundle, "tfdeploy_agent.py") == AGENT_SOURCE.read_bytes()
    assert read(bundle, "payload/pkg/deep/er/data file.csv") == b"a,b\n1,2\n"
    assert all(m.isfile() for m in found.values())
    assert found["payload/run.sh"].mode & 0o111        # executable bits survive


def test_skipped_parts_never_reach_the_bundle(payload):
    names = [p.as_posix() for p in payload_files(payload)]
    assert not any("__pycache__" in n or n.endswith(".pyc") or ".git" in n.split("/")
                   or ".ipynb_checkpoints" in n for n in names)


def test_a_symlink_inside_the_payload_is_fine_when_relative(payload):
    (payload / "link.py").symlink_to("pkg/util.py")
    assert "payload/link.py" in members(build_bundle(payload, "train.py", RUN_ID))


@pytest.mark.parametrize("target", ["/etc", "/etc/hostname", "../../outside.txt", "/nonexistent"])
def test_a_symlink_out_of_the_payload_is_refused(payload, target):
    (payload.parent / "outside.txt").write_text("secret")
    link = payload / "pkg" / "escape"
    link.symlink_to(target)
    with pytest.raises(BundleError, match="symlink points outside the payload") as caught:
        build_bundle(payload, "train.py", RUN_ID)
    assert str(link) in str(caught.value)


def test_missing_entry_script_and_payload_are_errors(payload, tmp_path):
    with pytest.raises(BundleError, match=r"entry script 'main\.py' not found in payload"):
        build_bundle(payload, "main.py", RUN_ID)
    with pytest.raises(BundleError, match=r"entry script 'pkg' not found"):
        build_bundle(payload, "pkg", RUN_ID)                   # a directory is not a script
    with pytest.raises(BundleError, match="payload directory .* does not exist"):
        build_bundle(tmp_path / "missing", "train.py", RUN_ID)
    (tmp_path / "file").write_text("")
    with pytest.raises(BundleError, match="does not exist"):
        build_bundle(tmp_path / "file", "train.py", RUN_ID)


def test_an_entry_in_a_subdirectory_is_found(payload):
    bundle = build_bundle(payload, "pkg/util.py", RUN_ID)
    assert "payload/pkg/util.py" in members(bundle)


@pytest.mark.parametrize("outside", ["../elsewhere.py", "ABSOLUTE"])
def test_an_entry_outside_the_payload_is_refused(payload, outside):
    script = payload.parent / "elsewhere.py"
    script.write_text("print('not shipped')\n")
    entry = str(script) if outside == "ABSOLUTE" else outside
    with pytest.raises(BundleError):
        build_bundle(payload, entry, RUN_ID)


def test_an_absolute_symlink_inside_the_payload_arrives_usable(payload):
    (payload / "alias.py").symlink_to(payload / "pkg" / "util.py")
    member = members(build_bundle(payload, "train.py", RUN_ID))["payload/alias.py"]
    assert member.isfile() or not Path(member.linkname).is_absolute()


def test_a_symlinked_directory_inside_the_payload_is_shipped(payload):
    (payload / "lib").symlink_to("pkg")
    found = members(build_bundle(payload, "train.py", RUN_ID))
    assert "payload/lib" in found or "payload/lib/util.py" in found
