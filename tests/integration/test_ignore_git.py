""".tfdeployignore against git itself: the files the payload walk keeps are exactly the files
`git ls-files --others --exclude-standard` lists with the same lines as the repository's
exclude file, over a fixed corpus of pattern sets and generated ones, on one tree of awkward
names. Lines refused as unusable are checked to be ones git can never match."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deploy.push.bundle import payload_files
from deploy.push.ignore import IgnoreFileError, IgnoreRules

GIT = shutil.which("git")
pytestmark = pytest.mark.skipif(GIT is None, reason="needs git (.ci/run installs it)")

TREE = [
    "a", "bb", "z", "ac", "c.txt", "A", ".hidden", ".d/a", "ab/a", "ab/c.txt", "a.b", "a*", "[a]", "#c",
    "!b", "x y/a", "trail ", "é.txt", "c/é", "c/ab.log", "a.d/b/c", "b/a/a.b", "b/ab/x.log",
    "deep/a/b/c/d.txt", "deep/x/a", "foo/bar", "foo/baz/bar", "foobar/bar", "fooy",
    "logs/a.log", "logs/keep/b.log", "src/data/x.py", "data/raw/big.bin", "data/y",
]

CORPUS = [
    "*", "a", "/a", "a/", "b/", "/b/", "*.txt", "*.log\n!a.log", "*.log\n!/logs/a.log",
    "logs/\n!logs/a.log", "logs\n!logs/keep/", "logs/*\n!logs/keep/", "**/a", "**/a/",
    "a/**", "a/**/c", "deep/**/d.txt", "deep/**", "**", "**/", "/**/a", "b/**/x.log",
    "foo**", "foo**/bar", "/foo**/bar", "foo/**/bar", "fo*/bar", "f*o/*", "*/bar", "*/*/bar",
    "?", "??", "?.b", "a?b", "[ab]", "[!ab]", "[^ab]", "[a-c]*", "[]a]", "[!]a]", "[a-]",
    "[-a]", "[[]a]", "\\[a]", "[[:alpha:]]", "[[:upper:]]", "[![:lower:]]*", "[[:punct:]]*",
    "[[:digit:]]*", "[[:space:]]*", "[[:alnum:].]*", "[[:]", "[[:a]", "\\#c", "#c", "\\!b",
    "!b", "a\\*", "a*", "\\a", "x\\ y/", "x y/", "trail\\ ", "trail ", "trail\\  ", "*.TXT",
    "é.txt", "?.txt", "??.txt", "???.txt", "c/?", "c/??", "*.b\n!a.b", "a.b\n!*.b", ".*",
    "/.*", ".d/", "*/", "/*/", "*/a", "*/a/", "a/*", "a.d/b/", "a.d/*/c", "data/\n!data/y",
    "data/*\n!data/y", "/data/raw/", "src/data/", "data", "!a\na", "a\n!a", "*\n!*/\n!*.txt",
    "*\n!*/", "*\n!b/\n!b/**", "*\n!*.py\n!*/", "b/*\n!b/a/", "b/*/\n!b/ab", "/*\n!/b",
    "**/ab/**", "**/ab", "ab/**/", "**/*.log", "**/**/a", "a/**/**/c", "***", "a***",
    "deep/***/d.txt", "deep/a/**/", "  \n\n", "# comment\n\n*.log", "*.log\r", "a\r\nb\r",
    "/", "!", "!/", "//a", "a//", "/a/b/c", "c/\\é", "[é]*", "[!é]*", "c/[a-z]*",
    "c/[!a-z]*", "[a-b-c]*", "[a\\-c]*", "[\\]]", "[\\!]b", "\\*", "foo\\/bar",
    "**\\/bar", "deep/**\\/d.txt",
]

# Lines git reads but can never match anything with: each is refused, naming file and line.
UNUSABLE = ["\\", "[", "a[", "[a", "[!", "[]", "[[:foo:]]", "[[::]]", "a\\", "a\\/", "[a\\"]
# Reversed ranges, refused too: git reads each as its first character alone (the second
# pattern), surely not what was meant.
REVERSED = [("[z-a]", "[z]"), ("*[b-a]", "*[b]"), ("?[c-a]*", "?[c]*"), ("[!b-a]*", "[!b]*"),
            ("[xc-ab]*", "[xcb]*")]

ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


class Lab:
    """A tree of awkward names, and a git repository (its git dir apart) over it."""

    def __init__(self, root: Path):
        self.tree, self.gitdir = root / "tree", root / "git"
        for name in TREE:
            path = self.tree / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
        subprocess.run([GIT, "init", "-q", "--bare", str(self.gitdir)], env=ENV, check=True)
        (self.gitdir / "info").mkdir(exist_ok=True)

    def git(self, lines: str) -> list[str]:
        (self.gitdir / "info" / "exclude").write_bytes(lines.encode())
        out = subprocess.run(
            [GIT, f"--git-dir={self.gitdir}", f"--work-tree={self.tree}", "-c",
             "core.bare=false", "-c", "core.ignorecase=false", "-c", "core.quotepath=false",
             "ls-files", "-z", "--others", "--exclude-standard"],
            cwd=self.tree, env=ENV, capture_output=True, check=True).stdout
        return sorted(os.fsdecode(p) for p in out.split(b"\0") if p)

    def ours(self, lines: str) -> list[str]:
        rules = IgnoreRules.parse(lines, builtin=False)
        return sorted(p.as_posix() for p in payload_files(self.tree, rules))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return Lab(tmp_path_factory.mktemp("ignore-vs-git"))


def test_the_lab_sees_every_file_with_no_rules(lab):
    assert lab.git("") == lab.ours("") == sorted(TREE)


def test_every_pattern_set_of_the_corpus_keeps_what_git_keeps(lab):
    def ours(lines):
        try:
            return lab.ours(lines)
        except IgnoreFileError as exc:
            return str(exc)
    disagree = [(lines, lab.git(lines + "\n"), ours(lines + "\n")) for lines in CORPUS]
    disagree = [d for d in disagree if d[1] != d[2]]
    assert not disagree, "\n".join(f"{lines!r}: git {g} ours {o}" for lines, g, o in disagree)


@pytest.mark.parametrize("line", UNUSABLE)
def test_a_line_git_can_never_match_is_refused_with_file_and_line(lab, line):
    assert lab.git(line + "\n") == sorted(TREE)      # git: as if the line were not there
    with pytest.raises(IgnoreFileError, match=r"^payload/\.tfdeployignore:2: .*cannot be used"):
        IgnoreRules.parse("*.log\n" + line + "\n", source="payload/.tfdeployignore")


@pytest.mark.parametrize("line, as_git_reads_it", REVERSED)
def test_a_reversed_range_is_refused_and_git_reads_it_as_its_first_character(lab, line,
                                                                           as_git_reads_it):
    assert lab.git(line + "\n") == lab.git(as_git_reads_it + "\n") == lab.ours(as_git_reads_it)
    with pytest.raises(IgnoreFileError, match=r"^x:1: .*range .* is reversed"):
        IgnoreRules.parse(line, source="x")


PIECES = ["a", "b", "c", "ab", ".", "*", "**", "?", "/", "[ab]", "[!a]", "[a-c]", "[]a]",
          "[[:alpha:]]", "\\*", "é", "x y", "\\ ", " ", "log", "foo", "bar", "deep", "data"]
lines = st.builds(
    lambda neg, pieces, slash: ("!" if neg else "") + "".join(pieces) + ("/" if slash else ""),
    st.booleans(), st.lists(st.sampled_from(PIECES), min_size=1, max_size=5), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, min_size=1, max_size=4))
def test_generated_pattern_sets_keep_what_git_keeps(lab, rules):
    text = "\n".join(rules) + "\n"
    assert lab.ours(text) == lab.git(text), text
