"""Every SSH host resolved by OpenSSH itself: `ssh -G` prints the options ssh would use for a
host without connecting (Include, Match, tokens, quoting, first value wins: all as ssh does).

What `ssh -G` prints unexpanded (IdentityFile, CertificateFile, ProxyCommand) is expanded here
as ssh expands it when it connects: `~` and %d are the account's home directory (ssh reads it
from the password database, not from $HOME), and the tokens of ssh_config(5) TOKENS.
The inventory's fields stand for ssh's flags: `user` is -l, `port` is -p, `identity_file` is
-i (tried first), `known_hosts` replaces UserKnownHostsFile, `jump` is -J.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pwd
import re
import shutil
import socket
import subprocess

from deploy.inventory import sshconfig
from deploy.inventory.address import Address
from deploy.inventory.sshconfig import Hop, Route, SshConfigError

SSH = "ssh"
TIMEOUT = 20.0      # `ssh -G` only reads files, but a `Match exec` command may take a while
# Tokens of IdentityFile, CertificateFile and IdentityAgent (ssh_config(5) TOKENS).
FILE_TOKENS = "%CdhikLlnpru"
PROXY_TOKENS = "%hknpr"      # ProxyCommand's, as sshconnect.c expands them
TOKEN = re.compile(r"%(.)|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", re.DOTALL)
# ssh's own warnings on a terminal-less stdin: not about the config.
NOISE = ("Pseudo-terminal will not be allocated",)


def available() -> bool:
    return shutil.which(SSH) is not None


def home() -> str:
    """The home directory ssh uses for `~` and %d: the account's, whatever $HOME says."""
    return pwd.getpwuid(os.getuid()).pw_dir


def local_user() -> str:
    """The user ssh logs in as when none is given (%u): the account's name."""
    return pwd.getpwuid(os.getuid()).pw_name


class OpenSsh:
    """The `ssh -G` answers of one inventory load, each question asked once."""

    def __init__(self) -> None:
        self._asked: dict[tuple, dict[str, list[str]]] = {}

    def options(self, ssh_config: str, host: str, user: str | None,
                port: int | None) -> dict[str, list[str]]:
        key = (ssh_config, host, user, port)
        if key not in self._asked:
            self._asked[key] = _ask(ssh_config, host, user, port)
        return self._asked[key]

    def route(self, ssh_config: str, address: str, port: int | None, user: str | None,
              identity_file: str | None, known_hosts: str | None, jump: str | None) -> Route:
        """The host's login and gateways as ssh resolves them, with the inventory's fields
        standing for the matching ssh flags."""
        keys = (identity_file,) if identity_file else ()   # ~ expanded when logging in
        if jump is not None and jump.lower() != sshconfig.NO_FILE:
            sshconfig.parse_hops(jump, "jump")      # its names checked before ssh runs at all
        found = self.options(ssh_config, address, user, port)
        target = _hop(found, address, address, user, keys_first=keys)
        if jump is not None:        # like -J, which also puts a ProxyCommand out of play
            target = dataclasses.replace(target, proxy_command=None)
            spec, field = (None if jump.lower() == sshconfig.NO_FILE else jump), "jump"
        else:
            spec, field = _one(found, "proxyjump"), "ssh_config"

        def lookup(name, host, hop_port, hop_user, keys_then, hop_field):
            options = self.options(ssh_config, host, hop_user, hop_port)
            return (_hop(options, name, host, hop_user, keys_then=keys_then),
                    _one(options, "proxyjump"))
        via = sshconfig.gateways(lookup, spec, keys, field) if spec else ()
        if known_hosts:             # the inventory's file, for every hop (UserKnownHostsFile)
            files = (os.path.expanduser(known_hosts),)
            target = dataclasses.replace(target, known_hosts=files)
            via = tuple(dataclasses.replace(hop, known_hosts=files) for hop in via)
        policy = (_one(found, "stricthostkeychecking") or "").lower()
        return Route(target, via, accept_new=policy in ("accept-new", "false", "no", "off"))


def config_args(ssh_config: str) -> tuple[list[str], str | None, str]:
    """ssh's -F arguments for the inventory's `ssh_config`, the text to give it on stdin (the
    default: the user's file, then the system's, as ssh reads them) and the files' names."""
    if ssh_config == sshconfig.NO_FILE:
        return ["-F", "none"], None, "no ssh config"
    if ssh_config != sshconfig.DEFAULT_FILE:
        path = os.path.expanduser(ssh_config)
        try:
            open(path, "rb").close()
        except OSError as exc:      # said plainly, rather than as ssh's fatal()
            raise SshConfigError(f"cannot read ssh config {path}: {exc.strerror or exc}",
                                 "ssh_config") from None
        return ["-F", path], None, path
    files = [f for f in (os.path.expanduser(sshconfig.USER_FILE), sshconfig.SYSTEM_FILE)
             if os.path.isfile(f)]
    if len(files) < 2:
        return ["-F", files[0] if files else "none"], None, files[0] if files else "no ssh config"
    text = "".join(f'Include "{f}"\n' for f in files)
    return ["-F", "/dev/stdin"], text, " and ".join(files)


def _ask(ssh_config: str, host: str, user: str | None, port: int | None) -> dict[str, list[str]]:
    args, stdin, named = config_args(ssh_config)
    command = [SSH, "-G", *args, *(["-l", user] if user else []),
               *(["-p", str(port)] if port else []), "--", host]
    try:
        done = subprocess.run(command, input=stdin or "", capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SshConfigError(f"`ssh -G` did not answer for {host!r} within {TIMEOUT:g} s with "
                             f"{named} (a slow Match exec?)", "ssh_config") from None
    if done.returncode != 0:
        said = "; ".join(line.strip() for line in done.stderr.splitlines()
                         if line.strip() and not line.startswith(NOISE))
        raise SshConfigError(f"ssh refuses {named} for {host!r}: {said or 'no reason given'}",
                             "ssh_config")
    options: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        keyword, _, value = line.partition(" ")
        options.setdefault(keyword.lower(), []).append(value)
    return options


def _one(options: dict[str, list[str]], keyword: str) -> str | None:
    value = options.get(keyword, [None])[0]
    return None if value is None or value.lower() == sshconfig.NO_FILE else value


@functools.lru_cache(maxsize=1)
def default_identities() -> tuple[str, ...]:
    """The key files ssh tries when none is configured (~/.ssh/id_*, by version)."""
    return tuple(_ask(sshconfig.NO_FILE, "tfdeploy-probe", None, None).get("identityfile", ()))


def _hop(options: dict[str, list[str]], name: str, host: str, given_user: str | None,
         keys_first: tuple[str, ...] = (), keys_then: tuple[str, ...] = ()) -> Hop:
    given_hostname, user = options["hostname"][0], options["user"][0]
    try:
        hostname = Address.parse(given_hostname).text
    except ValueError as exc:
        raise SshConfigError(f"ssh config gives {host!r} an unusable HostName: {exc}",
                             "ssh_config") from None
    port = int(options["port"][0])
    alias = _one(options, "hostkeyalias")
    tokens = {"%": "%", "d": home(), "h": given_hostname, "i": str(os.getuid()), "k": alias or host,
              "L": socket.gethostname().split(".")[0], "l": socket.gethostname(), "n": host,
              "p": str(port), "r": user, "u": local_user()}
    tokens["C"] = hashlib.sha1(f"{tokens['l']}{hostname}{port}{user}".encode()).hexdigest()

    def files(keyword: str) -> tuple[str, ...]:
        return tuple(expand(f, tokens, FILE_TOKENS, keyword) for f in options.get(keyword, ()))
    identities = options.get("identityfile", [])
    own = () if tuple(identities) == default_identities() else files("identityfile")
    agent = _one(options, "identityagent")
    proxy = _one(options, "proxycommand")
    timeout = _one(options, "connecttimeout")
    return Hop(
        # The local account's name is left unsaid unless given: None is "the local user".
        name=name, hostname=hostname, port=port,
        user=None if user == local_user() and not given_user else user,
        identity_files=tuple(dict.fromkeys((*keys_first, *own, *keys_then))),
        identities_only=_one(options, "identitiesonly") == "yes",
        identity_agent=agent if agent in (None, "SSH_AUTH_SOCK") or agent.lower() == "none"
        else expand(agent, tokens, FILE_TOKENS, "identityagent"),
        certificate_files=files("certificatefile"),
        known_hosts=_file_list(options, "userknownhostsfile"),
        global_known_hosts=tuple(expand(f, tokens, "", "globalknownhostsfile", tokens_too=False)
                                 for f in _file_list(options, "globalknownhostsfile")),
        host_key_alias=alias,
        proxy_command=proxy and expand(proxy, tokens, PROXY_TOKENS, "proxycommand",
                                       environment=False),
        connect_timeout=float(timeout) if timeout else None)


def _file_list(options: dict[str, list[str]], keyword: str) -> tuple[str, ...]:
    """A known_hosts list; `none` is no file. `ssh -G` prints its files joined by spaces, with
    no quotes: a file whose name has a space (`"~/Library/Application Support/ssh/known_hosts"`
    in the config) comes as several words. Every file ssh names starts with `/` (expanded, the
    user's files) or `~` (the global ones, expanded when used): a word that starts with neither
    goes on the file before it."""
    value = _one(options, keyword)
    files: list[str] = []
    for word in (value or "").split(" "):
        if files and not word.startswith(("/", "~")):
            files[-1] += " " + word
        elif word:
            files.append(word)
    return tuple(files)


def expand_tilde(value: str) -> str:
    """A leading `~` or `~user` as ssh expands it (tilde_expand_filename): from the password
    database, not $HOME; an unknown user's is left as written, which names no file."""
    if not value.startswith("~"):
        return value
    user, slash, rest = value[1:].partition("/")
    try:
        base = home() if not user else pwd.getpwnam(user).pw_dir
    except KeyError:
        return value
    return base.rstrip("/") + "/" + rest if slash else base


def expand(value: str, tokens: dict[str, str], allowed: str, keyword: str,
           environment: bool = True, tokens_too: bool = True) -> str:
    """`value` as ssh expands it: a leading `~` or `~user`, then %-tokens and ${VARIABLES}."""
    if environment:
        value = expand_tilde(value)
    if not tokens_too:
        return value

    def one(match: re.Match) -> str:
        token, variable = match.groups()
        if variable is not None:
            if not environment:
                return match.group(0)
            if variable not in os.environ:
                raise SshConfigError(f"{keyword} {value!r}: environment variable {variable} is "
                                     f"not set", "ssh_config")
            return os.environ[variable]
        if token not in allowed:
            raise SshConfigError(f"{keyword} {value!r}: unknown token %{token}", "ssh_config")
        return tokens[token]
    return TOKEN.sub(one, value)
