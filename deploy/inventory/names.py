"""Names that reach `ssh` (host, user, host key alias, gateway hops) checked before it sees
them: `ssh -G` and the ssh config's `Match exec` substitute them into shell commands (the
case of CVE-2023-51385), and a leading `-` would be read as an option."""
from __future__ import annotations

# Anything a POSIX shell gives a meaning to, ssh's own token character and the separators of
# a gateway chain; whitespace and control characters are refused on their own.
SHELL_METACHARACTERS = set("`'\"$\\;&|<>(){}[]*?!#~%,")


def name_problem(value: str) -> str | None:
    """Why `value` cannot be a host, user or alias name for ssh, or None."""
    if not value:
        return "must not be empty"
    if value.startswith("-"):
        return f"must not start with '-' (ssh would read {value!r} as an option)"
    for char in value:
        if char.isspace() or not char.isprintable():
            return f"must not hold whitespace or control characters, as {value!r} does"
        if char in SHELL_METACHARACTERS:
            return f"must not hold the shell metacharacter {char!r}, as {value!r} does"
    return None

