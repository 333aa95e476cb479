"""`inv check`'s answer as people read it: one row per host, and each problem in words."""
from __future__ import annotations

from rich.console import Group
from rich.text import Text

from deploy.console.plain import plain
from deploy.console.widths import fitted_widths, table_of
from deploy.host.probe import PACKAGES
from deploy.plan.checks import CheckReport, gpu_lines, rows


COLUMNS = ("host", "address", "python", *PACKAGES, "disk free", "ports", "mesh", "problems")


class HostRows:
    """The hosts' rows: a table where the terminal is wide enough for its cells whole, else
    (a narrow or piped terminal) one block of `column: value` lines per host, so that no
    cell is ever broken one character per line, nor cut off at the terminal's edge."""

    # Lists (ports, mesh, problem numbers) wrap at their commas; the rest stay whole.
    WRAPPING = ("ports", "mesh", "problems")

    def __init__(self, title: str, cells: list[list[Text]]):
        self.title, self.cells = title, cells

    def __rich_console__(self, console, options):
        widths = fitted_widths(COLUMNS, self.WRAPPING, self.cells, options.max_width)
        if widths is not None:
            yield table_of(self.title, COLUMNS, self.WRAPPING, self.cells, widths)
            return
        yield Text(self.title)
        for cells in self.cells:
            yield Text.assemble(cells[0], *(part for column, cell in zip(COLUMNS[1:], cells[1:])
                                            for part in (f"\n  {column}: ", cell)))


def report_view(report: CheckReport) -> Group:
    """The hosts' rows; their problems point into the numbered list below, which says each
    problem in words (plain lines, easy to copy)."""
    numbers = {p: i + 1 for i, p in enumerate(report.all_problems)}
    rows_shown = []
    for check, cells in zip(report.hosts, rows(report)):
        refs = ", ".join(f"#{numbers[p]}" for p in check.problems)
        cells[-1] = Text(refs, style="bold red") if refs else Text("ok", style="green")
        cells[-2] = Text(cells[-2], style="green" if cells[-2] == "ok" else "red")
        # The hosts' answers (versions, addresses) as plain text, never as markup.
        rows_shown.append([c if isinstance(c, Text) else Text(plain(str(c))) for c in cells])
    lines: list = [HostRows(f"check: {len(report.hosts)} host(s), {report.seconds:.1f} s",
                            rows_shown)]
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
