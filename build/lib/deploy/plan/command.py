"""Quoting for values that reach a remote shell.

Every value is quoted as one word; nothing from an inventory or the command line is ever
pasted into a command as shell syntax.
"""
from __future__ import annotations

import shlex

from deploy.errors import BadInput


def quote(value: str) -> str:
    if "\0" in value:
        raise BadInput("a NUL byte cannot be passed through a shell")
    return shlex.quote(value)


def quote_path(path: str) -> str:
    """Quote a path, leaving a leading ~/ unquoted so the host's shell expands its own home."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        rest = path[2:]
        return "~/" + quote(rest) if rest else "~/"
    return quote(path)


def join(words: list[str]) -> str:
    """A command from words that are already quoted (or are fixed shell syntax)."""
    return " ".join(words)


def split_args(text: str) -> list[str]:
    """The `--args` string as the user's shell would split it; BadInput when unbalanced."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"cannot split --args {text!r}: {exc}") from None
