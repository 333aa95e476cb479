"""`inv check`'s answer as people read it: one row per host, and each problem in words."""
from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from deploy.console.plain import plain
from deploy.host.probe import PACKAGES
from deploy.plan.checks import CheckReport, gpu_lines, rows


def report_view(report: CheckReport) -> Group:
    """The table, one row per host; its problems column points into the numbered list below,
    which says each problem in words (plain lines, easy to copy)."""
    numbers = {p: i + 1 for i, p in enumerate(report.all_problems)}
    table = Table(title=f"check: {len(report.hosts)} host(s), {report.seconds:.1f} s",
                  title_justify="left")
    for column in ("host", "address", "python", *PACKAGES, "disk free",
                   "ports", "mesh", "problems"):
        # Versions and sizes stay whole; long cells (addresses, port lists) fold.
        folds = column in ("address", "ports", "mesh", "problems")
        table.add_column(column, no_wrap=not folds, overflow="fold")
    for check, cells in zip(report.hosts, rows(report)):
        refs = ", ".join(f"#{numbers[p]}" for p in check.problems)
        cells[-1] = Text(refs, style="bold red") if refs else Text("ok", style="green")
        cells[-2] = Text(cells[-2], style="green" if cells[-2] == "ok" else "red")
        # The hosts' answers (versions, addresses) as plain text, never as markup.
        table.add_row(*(c if isinstance(c, Text) else Text(plain(str(c))) for c in cells))
    lines: list = [table]
    gpus = gpu_lines(report)
    if gpus:
        lines += [Text("GPUs", style="bold")] + [
            Text(plain(line), style="yellow" if "busy:" in line else None) for line in gpus]
    if report.problems:
        lines.append(Text("cluster: " + ", ".join(f"#{numbers[p]}" for p in report.problems),
                          style="bold red"))
    lines += [Text(plain(f"#{n} {p}"), style="red") for p, n in numbers.items()]
    if report.ok:
        lines.append(Text("all checks passed", style="green"))
    return Group(*lines)
