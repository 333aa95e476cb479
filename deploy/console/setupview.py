"""`inv setup` as people see it: a live row per host while it works, then the environments
and their versions."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text

from deploy.console.plain import plain
from deploy.host.probe import PACKAGES
from deploy.plan.envbuild import SetupPlan
from deploy.state.envprogress import HostProgress

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


def versions_table(plan: SetupPlan, progress: dict[str, HostProgress]) -> Table:
    table = Table(title="environments", title_justify="left")
    for column in ("host", "environment", "state", "s", *VERSION_COLUMNS):
        table.add_column(column)
    for hp in plan.hosts:
        p = progress[hp.host.name]
        versions = p.versions
        table.add_row(p.name, plain(p.env or "-"),
                      Text(p.state, style=STATE_STYLES.get(p.state, "")), f"{p.seconds():.1f}",
                      *(Text(plain(str(versions.get(c) or "-"))) for c in VERSION_COLUMNS))
    return table
