"""Commands as values: what a host's shell is given, quoted in one place (Command.line).

A word is a value unless it says otherwise: every plain str, whether from the inventory, the
command line or our own code, reaches the program as exactly one literal word. Two kinds of
word are treated differently, and each is a type so that the choice is visible where the
command is built: a HostPath keeps a leading `~/` for the host to expand, and Shell is syntax
written in our code (`&&`, `if [ -f`, `; fi`), never built from input.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Mapping

from deploy.errors import BadInput
from deploy.host.protocol import HostRequest
from deploy.inventory.model import EnvValue


class HostPath(str):
    """A path on the host. A leading `~/` stays unquoted so that the host's shell expands its
    own home (the controller's home means nothing there); the rest is a literal value."""


class Shell(str):
    """Shell syntax from our own code, put into the line as it is. Never make one from an
    inventory, a flag or anything else that comes from outside: the host's shell would run it."""


def _quoted(word: str) -> str:
    """The word as the line writes it, by its kind."""
    if isinstance(word, Shell):
        return str(word)
    home, rest = word[:2], word[2:]
    if isinstance(word, HostPath) and home in ("~", "~/"):
        return home + (shlex.quote(rest) if rest else "")
    return shlex.quote(word)


@dataclass(frozen=True)
class Command:
    """One command for a host's shell: its words and what it reads on stdin. Environments
    never go into a line (a process list on the host would show them): a task's travels in
    its launch Request."""
    argv: tuple[str, ...]
    stdin: str = ""          # a short description of what it reads on stdin; "": nothing

    def __post_init__(self):
        # Refused when planned, before anything is sent: no argv can carry a NUL.
        if any("\0" in word for word in self.argv):
            raise BadInput("a NUL byte cannot be passed through a shell")

    @property
    def line(self) -> str:
        """The command line, each word quoted as its kind says: what the transport sends."""
        return " ".join(_quoted(word) for word in self.argv)

    def shown(self) -> str:
        """The line and, after `<`, what goes on its stdin: what --dry-run prints."""
        return self.line + (f"    < {self.stdin}" if self.stdin else "")


@dataclass(frozen=True)
class Request:
    """One step for a host's agent (deploy/host/agent.py), which runs for the whole run and
    takes requests on its channel: a typed request of deploy/host/protocol.py (a HostPath in
    its fields is expanded against the host's home there, every other value is literal), the
    environment its program gets (never shown: values travel only in the request) and what
    comes with it."""
    message: HostRequest
    env: Mapping[str, EnvValue] = field(default_factory=dict)
    body: str = ""           # a short description of the bytes that follow it; "": none

    @property
    def verb(self) -> str:
        return self.message.verb

    def shown(self) -> str:
        """What --dry-run prints: the verb, its fields (words as a shell would quote them) and
        after `<` what comes with it."""
        words = " ".join([self.verb] + [f"{name}={_shown_value(value)}"
                                        for name, value in self.message.fields().items()])
        return f"agent: {words}" + (f"    < {self.body}" if self.body else "")

    def shown_env(self) -> dict[str, str]:
        return {key: value.shown() for key, value in self.env.items()}

    def __repr__(self) -> str:
        return f"Request({self.message!r}, env={self.shown_env()!r})"

    def wire(self, **extra_env: str) -> dict:
        """The request as the agent reads it, with the real environment values and `extra_env`
        on top. For the wire only."""
        fields = self.message.fields()
        home = [name for name, value in fields.items() if isinstance(value, HostPath)]
        home += [f"{name}.{i}" for name, value in fields.items() if isinstance(value, list)
                 for i, item in enumerate(value) if isinstance(item, HostPath)]
        doc = {"verb": self.verb, "fields": fields, "home": home}
        if self.env or extra_env:
            doc["env"] = {**{key: value.value for key, value in self.env.items()}, **extra_env}
        return doc


def _shown_value(value) -> str:
    if isinstance(value, str):
        return _quoted(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + " ".join(_quoted(v) for v in value) + "]"
    return shlex.quote(json.dumps(value, separators=(",", ":")))


def split_args(text: str) -> list[str]:
    """The `--args` string as the user's shell would split it; BadInput when unbalanced."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise BadInput(f"cannot split --args {text!r}: {exc}") from None
