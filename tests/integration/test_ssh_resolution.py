"""Differential: `inv hosts --json` against OpenSSH's own `ssh -G`, field by field, over the
configs of tests/ssh_corpus (Include, Match, capitalised keywords, tokens, quoting, comments,
Host negation, IdentitiesOnly, several known_hosts files, ProxyCommand, ProxyJump chains).

Each config's first lines say which hosts to resolve (`# hosts: alias[,user=U][,port=P] ...`)
and whether ssh refuses it (`# refused`). The expected values come from `ssh -G` run here,
with what it prints unexpanded expanded by this file's own reading of ssh_config(5) TOKENS.
Every config is given with -F, and HOME is a scratch directory: this machine's ~/.ssh is
never read. Nothing connects anywhere.
"""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from asuser import inv_as_user

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "ssh_corpus"
ACCOUNT = pwd.getpwuid(os.getuid())


def ssh_g(config: Path | str, host: str, user: str | None = None,
          port: int | None = None) -> dict[str, list[str]]:
    done = subprocess.run(["ssh", "-G", "-F", str(config), *(["-l", user] if user else []),
                           *(["-p", str(port)] if port else []), "--", host],
                          capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    options: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        options.setdefault(key, []).append(value)
    return options


def expand(value: str, tokens: dict[str, str]) -> str:
    if value.startswith("~/"):
        value = ACCOUNT.pw_dir + value[1:]
    return re.sub(r"%(.)", lambda m: tokens[m.group(1)], value)


def tokens(options: dict, original: str) -> dict[str, str]:
    host, port, user = options["hostname"][0], options["port"][0], options["user"][0]
    local = socket.gethostname()
    return {"%": "%", "h": host, "p": port, "r": user, "n": original, "d": ACCOUNT.pw_dir,
            "u": ACCOUNT.pw_name, "l": local, "L": local.split(".")[0], "i": str(os.getuid()),
            "k": options.get("hostkeyalias", [original])[0],
            "C": hashlib.sha1(f"{local}{host}{port}{user}".encode()).hexdigest()}


def files_as_written(config: Path, keyword: str, printed: str,
                     expand_word) -> list[str]:
    """A known_hosts keyword's files. `ssh -G` prints them joined by spaces and unquoted, so
    a file whose name has a space is read here from the config's own words (shlex, as ssh
    splits a line): the line whose words, expanded, are what ssh printed."""
    if printed == "none":
        return []
    for line in config.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0].lower() == keyword and \
                " ".join(map(expand_word, words[1:])) == printed:
            return [expand(word, {}) for word in map(expand_word, words[1:])]
    return [expand(word, {}) for word in printed.split()]


def expected(config: Path, host: str, user: str | None, port: int | None,
             defaults: list[str]) -> dict:
    options = ssh_g(config, host, user, port)
    values = tokens(options, host)
    identities = options.get("identityfile", [])
    proxy = options.get("proxycommand", [None])[0]
    # The user's files come expanded (~ and tokens); the global ones as written, and ssh
    # expands their ~ when it reads them.
    known = files_as_written(config, "userknownhostsfile", options["userknownhostsfile"][0],
                             lambda word: expand(word, values))
    global_known = files_as_written(config, "globalknownhostsfile",
                                    options["globalknownhostsfile"][0], lambda word: word)
    return {
        "hostname": options["hostname"][0], "user": options["user"][0],
        "port": int(options["port"][0]),
        "identity_files": [] if identities == defaults else [expand(f, values)
                                                             for f in identities],
        "identities_only": options["identitiesonly"][0] == "yes",
        "known_hosts": known, "global_known_hosts": global_known,
        "host_key_alias": options.get("hostkeyalias", [None])[0],
        "jump": jump_chain(config, options.get("proxyjump", [None])[0]),
        "proxy_command": None if proxy in (None, "none") or "proxyjump" in options
        else expand_proxy(proxy, values),
    }


def expand_proxy(command: str, values: dict[str, str]) -> str:
    return re.sub(r"%(.)", lambda m: values[m.group(1)], command)


def jump_chain(config: Path, spec: str | None, depth: int = 0) -> list[str]:
    """Each hop as `ssh -J` resolves it; the first hop's own ProxyJump comes before it."""
    if not spec or spec == "none":
        return []
    chain = []
    for i, part in enumerate(spec.split(",")):
        # ssh's hpdelim: brackets may hold any host (an IPv6 address, an IPv4 one, a name).
        match = re.fullmatch(r"(?:(?P<u>[^@]+)@)?(?:\[(?P<b>[^\]]+)\]|(?P<h>[^:@]+))"
                             r"(?::(?P<p>\d+))?", part)
        name = match["b"] or match["h"]
        hop = ssh_g(config, name, match["u"], int(match["p"]) if match["p"] else None)
        own = hop.get("proxyjump", [None])[0]
        if i == 0 and own and own.split(",")[0].split("@")[-1].split(":")[0] not in (
                name, hop["hostname"][0]):
            chain += jump_chain(config, own, depth + 1)
        chain.append(f"{hop['user'][0]}@{hop['hostname'][0]}:{hop['port'][0]}")
    return chain


def corpus_case(name: str, tmp_path: Path) -> tuple[Path, list[tuple], bool]:
    """The config (Include paths made absolute in a copy), its hosts, whether refused."""
    text = (CORPUS / name).read_text().replace("@CORPUS@", str(CORPUS))
    config = tmp_path / name
    config.write_text(text)
    hosts = []
    for spec in re.search(r"^# hosts: (.*)$", text, re.M).group(1).split():
        address, *fields = spec.split(",")
        extra = dict(f.split("=") for f in fields)
        hosts.append((address, extra.get("user"), int(extra["port"]) if "port" in extra
                      else None))
    return config, hosts, text.startswith("# refused")


def inv_hosts(inventory: Path, home: Path) -> subprocess.CompletedProcess:
    return inv_as_user("hosts", "--hosts", str(inventory), "--json", home=home, timeout=120)


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.conf")))
def test_inv_hosts_agrees_with_ssh_g(name, tmp_path):
    config, hosts, refused = corpus_case(name, tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    entries = [{"name": f"h{i}", "address": address, "workdir": f"/w/{i}",
                **({"user": user} if user else {}), **({"port": port} if port else {})}
               for i, (address, user, port) in enumerate(hosts)]
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"defaults": {"ssh_config": str(config)},
                                         "hosts": entries}))
    done = inv_hosts(inventory, home)
    if refused:
        assert done.returncode == 2, done.stdout + done.stderr
        assert str(config) in " ".join(done.stdout.split()), done.stdout
        return
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout)
    defaults = ssh_g("none", "tfdeploy-probe").get("identityfile", [])
    assert [g["name"] for g in got] == [e["name"] for e in entries]
    for (address, user, port), found in zip(hosts, got):
        want = expected(config, address, user, port, defaults)
        assert {k: found[k] for k in want} == want, (address, found)


@pytest.mark.parametrize("field, value", [
    ("address", "web1;touch${IFS}pwned"), ("address", "-oProxyCommand=x"),
    ("address", "a b"), ("user", "$(id)"), ("user", "-l"), ("jump", "gw`id`"),
])
def test_names_ssh_must_not_see_are_refused_before_it_sees_them(field, value, tmp_path):
    """A `Match exec` that would record every name it is given: none reaches it."""
    seen = tmp_path / "seen"
    config = tmp_path / "config"
    config.write_text(f'Match exec "echo %n >> {seen}"\n    Port 2222\n')
    entry = {"name": "a", "address": "web1", "workdir": "/w", field: value}
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"defaults": {"ssh_config": str(config)},
                                         "hosts": [entry]}))
    home = tmp_path / "home"
    home.mkdir()
    done = inv_hosts(inventory, home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"field '{field}'" in done.stdout, done.stdout
    assert not seen.exists()
