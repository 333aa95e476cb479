"""`inv setup` as people see it: a live row per host while it works, then the environments
and their versions."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text

from deploy.console.plain import plain
from deploy.host.probe import PACKAGES
from deploy.state.envprogress import HostProgress
from deploy.state.events import SetupResult

VERSION_COLUMNS = ("python", *PACKAGES)


STATE_STYLES = {"checking": "dim", "building": "yellow", "built": "green", "reused": "green",
                "failed": "bold red"}


def progress_table(progress: dict[str, HostProgress]) -> Table:
    table = Table(title="setup", title_justify="left")
    for column in ("host", "state", "s", "now"):
        table.add_column(column, overflow="ellipsis", no_wrap=column == "now")
    for p in progress.values():
        table.add_row(p.name, Text(p.state, style=STATE_STYLES.get(p.state, "")),
                      f"{p.seconds():.0f}", Text(plain(p.line[-100:])))
    return table


def versions_table(hosts: tuple[SetupResult, ...]) -> Table:
    table = Table(title="environments", title_justify="left")
    for column in ("host", "environment", "state", "s", *VERSION_COLUMNS):
        table.add_column(column)
    for h in hosts:
        table.add_row(h.name, plain(h.env or "-"),
                      Text(h.state, style=STATE_STYLES.get(h.state, "")), f"{h.seconds:.1f}",
                      *(Text(plain(str(h.versions.get(c) or "-"))) for c in VERSION_COLUMNS))
    return table
