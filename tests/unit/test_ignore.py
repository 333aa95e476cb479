"""`.tfdeployignore` rules (gitignore syntax) and what they keep out of the manifest."""
from __future__ import annotations

import pytest

from deploy.push.bundle import BundleError, manifest, payload_files
from deploy.push.ignore import IgnoreFileError, IgnoreRules


def ignored(rules: str, path: str, is_dir: bool = False) -> bool:
    return IgnoreRules.parse(rules, builtin=False).ignored(path, is_dir)


@pytest.mark.parametrize("rules, path, is_dir, expected", [
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),          # no slash: any depth
    ("*.log", "a.log.txt", False, False),
    ("a?c", "abc", False, True),
    ("a?c", "a/c", False, False),                     # ? never matches /
    ("data/", "data", True, True),
    ("data/", "data", False, False),                  # dir-only rule, a file of that name
    ("data/", "x/data", True, True),
    ("/data", "data", True, True),                    # anchored
    ("/data", "x/data", True, False),
    ("doc/*.txt", "doc/a.txt", False, True),
    ("doc/*.txt", "x/doc/a.txt", False, False),       # a middle slash anchors too
    ("doc/*.txt", "doc/sub/a.txt", False, False),     # * never crosses /
    ("**/cache", "a/b/cache", True, True),
    ("**/cache", "cache", True, True),
    ("a/**/b", "a/b", False, True),
    ("a/**/b", "a/x/y/b", False, True),
    ("logs/**", "logs/x/y", False, True),
    ("*.bin\n!keep.bin", "keep.bin", False, False),   # negation: the last match wins
    ("*.bin\n!keep.bin", "drop.bin", False, True),
    ("!keep.bin\n*.bin", "keep.bin", False, True),
    ("# a comment\n", "# a comment", False, False),
    ("\\#hash", "#hash", False, True),
    ("\\!bang", "!bang", False, True),
    ("  \n\n", "x", False, False),
    ("trailing   ", "trailing", False, True),
    ("[ab].txt", "b.txt", False, True),
    ("[!ab].txt", "b.txt", False, False),
    ("[!ab].txt", "c.txt", False, True),
])
def test_rules(rules, path, is_dir, expected):
    assert ignored(rules, path, is_dir) is expected


def test_builtin_rules_skip_caches_and_vcs_but_can_be_negated():
    rules = IgnoreRules.parse("")
    assert rules.ignored("pkg/__pycache__", True) and rules.ignored(".git", True)
    assert rules.ignored("a/b.pyc", False) and not rules.ignored("a/b.py", False)
    assert not IgnoreRules.parse("!vendored.pyc").ignored("vendored.pyc", False)


@pytest.fixture
def payload(tmp_path):
    root = tmp_path / "payload"
    for d in ("data/raw", "src/data", "logs", "keep"):
        (root / d).mkdir(parents=True)
    for f in ("train.py", "data/raw/big.bin", "src/data/x.py", "src/notes.tmp", "logs/a.log",
              "keep/a.tmp", "keep/b.tmp", "top.bin"):
        (root / f).write_text(f)
    return root


def test_the_payloads_ignore_file_shapes_the_manifest(payload):
    (payload / ".tfdeployignore").write_text(
        "# data stays home\n/data/\n*.tmp\n!keep/b.tmp\nlogs\n*.bin\n")
    paths = [f.path for f in manifest(payload, "train.py")]
    assert paths == [".tfdeployignore", "keep/b.tmp", "src/data/x.py", "train.py"]


def test_a_directory_excluded_keeps_its_files_out_even_if_negated(payload):
    (payload / ".tfdeployignore").write_text("logs/\n!logs/a.log\n")
    assert "logs/a.log" not in [p.as_posix() for p in payload_files(payload)]


def test_an_ignored_symlink_out_of_the_payload_is_not_refused(payload, tmp_path):
    (payload / "outside").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="symlink points outside"):
        manifest(payload, "train.py")
    (payload / ".tfdeployignore").write_text("outside\n")
    assert "outside" not in [f.path for f in manifest(payload, "train.py")]


def test_an_ignored_entry_script_is_an_error(payload):
    (payload / ".tfdeployignore").write_text("train.py\n")
    with pytest.raises(BundleError, match="excluded by .*tfdeployignore"):
        manifest(payload, "train.py")


def test_an_ignore_file_too_large_or_not_utf8_is_refused_naming_it(payload):
    ignore = payload / ".tfdeployignore"
    ignore.write_bytes(b"*.tmp\n" * 200_000)
    with pytest.raises(IgnoreFileError, match=rf"^{ignore}: larger than 1 MiB"):
        manifest(payload, "train.py")
    ignore.write_bytes(b"*.tmp\ncaf\xe9\n")
    with pytest.raises(IgnoreFileError, match=rf"^{ignore}:2: not UTF-8 text"):
        manifest(payload, "train.py")
