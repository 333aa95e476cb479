"""`inv check`'s answer as people read it: one row per host, and each problem in words."""
from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text

from deploy.console.plain import plain
from deploy.host.probe import PACKAGES
from deploy.plan.checks import CheckReport, gpu_lines, rows


COLUMNS = ("host", "address", "python", *PACKAGES, "disk free", "ports", "mesh", "problems")


class HostRows:
    """The hosts' rows: a table where the terminal is wide enough for its cells whole, else
    (a narrow or piped terminal) one block of `column: value` lines per host, so that no
    cell is ever broken one character per line, nor cut off at the terminal's edge."""

    WRAPPING = ("ports", "mesh", "problems")
    # Each column's padding (a space either side) and border, and the table's last border.
    BORDERS = 3 * len(COLUMNS) + 1

    def __init__(self, title: str, cells: list[list[Text]]):
        self.title, self.cells = title, cells

    def table(self, widths: list[int] | None = None) -> Table:
        """The table; with `widths`, each column exactly that wide (the cells inside it)."""
        table = Table(title=self.title, title_justify="left")
        for i, column in enumerate(COLUMNS):
            # Lists (ports, mesh, problem numbers) wrap at their commas; the rest stay whole.
            table.add_column(column, no_wrap=column not in self.WRAPPING,
                             min_width=len(column), width=widths[i] if widths else None)
        for cells in self.cells:
            table.add_row(*cells)
        return table

    def widths(self) -> tuple[list[int], list[int]]:
        """Each column's narrowest width with every cell whole (a list: its longest item, and
        at least its header) and its widest (every cell on one line)."""
        narrowest, widest = [], []
        for i, column in enumerate(COLUMNS):
            texts = [cells[i].plain for cells in self.cells]
            widest.append(max([len(column)] + [cell_len(t) for t in texts]))
            if column in self.WRAPPING:
                narrowest.append(max([len(column)] + [cell_len(word) for t in texts
                                                      for word in t.split()]))
            else:
                narrowest.append(widest[-1])
        return narrowest, widest

    def fitted(self, room: int) -> list[int] | None:
        """Column widths that fill at most `room` cells (borders and padding aside): every
        column as wide as its cells, the lists narrowed where they must be; None where even
        the narrowest do not fit. Set here rather than left to rich, whose narrowing of a table
        too wide crops the cells it cannot wrap (the problems column first) when it is within
        a few cells of fitting."""
        narrowest, widest = self.widths()
        spare = room - sum(narrowest)
        if spare < 0:
            return None
        fitted = list(narrowest)
        for i, column in enumerate(COLUMNS):
            grow = min(spare, widest[i] - narrowest[i])
            fitted[i] += grow
            spare -= grow
        return fitted

    def __rich_console__(self, console, options):
        widths = self.fitted(options.max_width - self.BORDERS)
        if widths is not None:
            yield self.table(widths)
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
