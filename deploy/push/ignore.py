"""`.tfdeployignore`: which payload files stay home, read as git reads a .gitignore.

The matcher follows git's own (dir.c for the lines, wildmatch.c for the patterns): `#`
comments, trailing spaces dropped unless escaped, a CR before the newline dropped, `\\`
escaping the next character, `!` negation (the last matching rule wins), `*` and `?` (never
across `/`), `[...]` classes with ranges, `!`/`^` negation and `[:alpha:]`-style names, `**`
(any number of directories, only between slashes or at either end; elsewhere it is `*`), a
trailing `/` (directories only), and a `/` anywhere but at the end anchoring the pattern to
the payload root (otherwise it matches a name at any depth). As in git, a file inside an
excluded directory cannot be re-included: the walk never enters that directory. Patterns and
paths are compared byte for byte (UTF-8), as git does: `?` is one byte.

A line git would read but that can never do what it says is refused, naming the file and the
line: an unclosed `[`, an unknown `[:class:]` and a trailing unescaped backslash (git never
matches anything with these), and a reversed range such as `[z-a]` (git silently reads it as
`[z]`). tests/unit/test_ignore_git.py
checks the matcher against git itself.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from deploy.errors import BadInput

IGNORE_FILE = ".tfdeployignore"
# Never worth sending, whatever the file says (a user may still re-include them with `!`).
BUILTIN = ("__pycache__/", ".git/", ".ipynb_checkpoints/", "*.pyc")
# An ignore file is a few lines; past this it is not one.
MAX_IGNORE_BYTES = 1 << 20

# wildmatch.c's character classes, over ASCII as git's own ctype is.
_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "blank": " \t", "cntrl": "\x00-\x1f\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
    "punct": "!-/:-@\\[-`{-~", "space": "\t\n\v\f\r ", "upper": "A-Z",
    "xdigit": "0-9A-Fa-f",
}


class IgnoreFileError(BadInput):
    pass


class Unusable(ValueError):
    """Why a pattern can never match what it says."""


@dataclass(frozen=True)
class Rule:
    pattern: str
    regex: re.Pattern
    negated: bool
    dir_only: bool
    line: int


def _bracket(glob: str, i: int) -> tuple[str, int]:
    """The class starting at glob[i] == "[" as a regex (never matching "/"), and the index
    after its "]". Unusable for what git's wildmatch aborts on or can never match."""
    n, j = len(glob), i + 1
    negated = j < n and glob[j] in "!^"
    j += negated
    members: list[str] = []
    first = True
    prev: str | None = None
    while True:
        if j >= n:
            raise Unusable("'[' is never closed by ']'")
        c = glob[j]
        if c == "]" and not first:
            break
        first = False
        if c == "\\":
            j += 1
            if j >= n:
                raise Unusable("'[' is never closed by ']'")
            prev = glob[j]
            members.append(re.escape(prev))
        elif c == "-" and prev is not None and j + 1 < n and glob[j + 1] != "]":
            j += 1
            end = glob[j]
            if end == "\\":
                j += 1
                if j >= n:
                    raise Unusable("'[' is never closed by ']'")
                end = glob[j]
            if end < prev:
                # git reads it as the single character `prev` (already a member): surely
                # not what was meant.
                raise Unusable(f"range {prev}-{end} is reversed (git would match only "
                               f"{prev!r} with it)")
            members.append(re.escape(prev) + "-" + re.escape(end))
            prev = None
        elif c == "[" and glob.startswith("[:", j):
            close = glob.find("]", j + 2)
            if close < 0:
                raise Unusable("'[' is never closed by ']'")
            if close - (j + 2) >= 1 and glob[close - 1] == ":":
                name = glob[j + 2:close - 1]
                if name not in _CLASSES:
                    raise Unusable(f"unknown character class [:{name}:] (known: "
                                   f"{', '.join(_CLASSES)})")
                members.append(_CLASSES[name])
                prev = None
                j = close
            else:                   # no ":]": a plain "[" in the class, as git reads it
                prev = "["
                members.append(re.escape("["))
        else:
            prev = c
            members.append(re.escape(c))
        j += 1
    body = "".join(members)
    return (f"[^/{body}]" if negated else f"(?!/)[{body}]"), j + 1


def _translate(glob: str, start: int = 0) -> str:
    """A wildmatch pattern (WM_PATHNAME) as a regex over the path's bytes (as latin-1).
    `start`: where git's wildmatch is handed the pattern. For a pattern with a slash, git
    compares the literal part before the first wildcard itself and gives wildmatch the rest,
    so a `**` right there counts as at the start (`a/foo**/y` matches `a/fooy` in git)."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if c == "*":
            j = i
            while j < n and glob[j] == "*":
                j += 1
            double = j - i >= 2
            at_start = i in (0, start) or glob[i - 1] == "/"
            if double and at_start and (j == n or glob[j] == "/"):
                if j == n:
                    out.append(".*")
                    i = j
                else:                      # "**/": no directory, or any number of them
                    out.append("(?:.*/)?")
                    i = j + 1
                continue
            if double and at_start and glob.startswith("\\/", j):
                out.append(".*")           # "**\/": any run, then the escaped slash
            else:
                out.append("[^/]*")
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            piece, i = _bracket(glob, i)
            out.append(piece)
        elif c == "\\":
            if i + 1 >= n:
                raise Unusable("ends with a backslash that escapes nothing")
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _trim_trailing_spaces(text: str) -> str:
    """git's trim_trailing_spaces: spaces at the end go unless a backslash escapes them."""
    last_space = None
    i = 0
    while i < len(text):
        c = text[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= len(text):
                return text
            last_space = None
        else:
            last_space = None
        i += 1
    return text if last_space is None else text[:last_space]


def _as_bytes(text: str) -> str:
    """`text` as its UTF-8 bytes, one character each: git matches bytes, not characters."""
    return os.fsencode(text).decode("latin-1")


def parse_rule(text: str, line: int = 0) -> Rule | None:
    """One line of an ignore file, or None for blanks and comments; Unusable for a pattern
    that can never match what it says."""
    raw = text[:-1] if text.endswith("\r") else text
    if not raw or raw.startswith("#"):
        return None
    stripped = _trim_trailing_spaces(raw)
    negated = stripped.startswith("!")
    body = stripped[1:] if negated else stripped
    dir_only = body.endswith("/")
    if dir_only:
        body = body[:-1]
    if not body:
        return None
    glob = _as_bytes(body)
    if "/" in glob:                     # matched against the whole path from the root
        glob = glob[1:] if glob.startswith("/") else glob
        literal = re.match(r"[^*?\[\\]*", glob).end()
        regex = _translate(glob, literal)
    else:                               # matched against the last name, at any depth
        regex = "(?:.*/)?" + _translate(glob)
    return Rule(stripped, re.compile(regex + r"\Z", re.DOTALL), negated, dir_only, line)


class IgnoreRules:
    def __init__(self, rules: list[Rule]):
        self.rules = rules

    @classmethod
    def parse(cls, text: str, builtin: bool = True, source: str = IGNORE_FILE) -> "IgnoreRules":
        """The rules of `text` (after the built-in ones); IgnoreFileError names `source` and
        the line of a pattern that cannot be used."""
        rules = [parse_rule(t) for t in BUILTIN] if builtin else []
        if text.startswith("\ufeff"):           # a byte order mark, skipped as git does
            text = text[1:]
        for number, line in enumerate(text.split("\n"), start=1):
            try:
                rules.append(parse_rule(line, number))
            except Unusable as exc:
                raise IgnoreFileError(f"{source}:{number}: {line.strip()!r} cannot be used: "
                                      f"{exc}") from None
        return cls([r for r in rules if r is not None])

    @classmethod
    def of_payload(cls, payload: Path) -> "IgnoreRules":
        path = payload / IGNORE_FILE
        return cls.parse(read_ignore_file(path) if path.is_file() else "", source=str(path))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the payload-relative POSIX path `rel` stays home (its parents not checked:
        the walk does not descend into excluded directories)."""
        path = _as_bytes(rel)
        verdict = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(path):
                verdict = not rule.negated
        return verdict


def read_ignore_file(path: Path) -> str:
    """The file's text, read up to MAX_IGNORE_BYTES; IgnoreFileError naming it otherwise."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_IGNORE_BYTES + 1)
    except OSError as exc:
        raise IgnoreFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_IGNORE_BYTES:
        raise IgnoreFileError(f"{path}: larger than {MAX_IGNORE_BYTES >> 20} MiB: not an "
                              "ignore file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise IgnoreFileError(f"{path}:{line}: not UTF-8 text (byte {exc.start}: "
                              f"{data[exc.start:exc.start + 1]!r})") from None
