"""`.tfdeployignore`: which payload files stay home, in gitignore syntax.

Supported as git does it: `#` comments, `\\#`/`\\!` escapes, `!` negation (the last matching
rule wins), `*` and `?` (never across `/`), `[...]` classes, `**` (any number of directories),
a trailing `/` (directories only) and a `/` anywhere but at the end anchoring the pattern to the
payload root (otherwise it matches a name at any depth). As in git, a file inside an excluded
directory cannot be re-included: the walk never enters that directory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILE = ".tfdeployignore"
# Never worth sending, whatever the file says (a user may still re-include them with `!`).
BUILTIN = ("__pycache__/", ".git/", ".ipynb_checkpoints/", "*.pyc")


@dataclass(frozen=True)
class Rule:
    pattern: str
    regex: re.Pattern
    negated: bool
    dir_only: bool
    line: int


def _translate(glob: str) -> str:
    """A gitignore glob (already stripped of `!`, anchors and a trailing /) as a regex."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = glob.find("]", i + 2 if glob[i + 1:i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = glob[i + 1:end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def parse_rule(text: str, line: int = 0) -> Rule | None:
    """One line of an ignore file, or None for blanks and comments."""
    raw = text.rstrip("\n")
    # Trailing spaces are dropped unless escaped.
    stripped = raw.rstrip(" ")
    if stripped.endswith("\\") and len(raw) > len(stripped):
        stripped += " "
    if not stripped or stripped.startswith("#"):
        return None
    negated = stripped.startswith("!")
    body = stripped[1:] if negated else stripped
    if body.startswith(("\\#", "\\!")):
        body = body[1:]
    dir_only = body.endswith("/")
    body = body.rstrip("/")
    if not body:
        return None
    anchored = "/" in body
    body = body.lstrip("/")
    prefix = "" if anchored or body.startswith("**/") else "(?:.*/)?"
    regex = re.compile(prefix + _translate(body) + r"\Z", re.DOTALL)
    return Rule(stripped, regex, negated, dir_only, line)


class IgnoreRules:
    def __init__(self, rules: list[Rule]):
        self.rules = rules

    @classmethod
    def parse(cls, text: str, builtin: bool = True) -> "IgnoreRules":
        lines = list(BUILTIN) if builtin else []
        rules = [parse_rule(t) for t in lines]
        rules += [parse_rule(t, n) for n, t in enumerate(text.splitlines(), start=1)]
        return cls([r for r in rules if r is not None])

    @classmethod
    def of_payload(cls, payload: Path) -> "IgnoreRules":
        path = payload / IGNORE_FILE
        return cls.parse(path.read_text(encoding="utf-8") if path.is_file() else "")

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the payload-relative POSIX path `rel` stays home (its parents not checked:
        the walk does not descend into excluded directories)."""
        verdict = False
        for rule in self.rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(rel):
                verdict = not rule.negated
        return verdict
