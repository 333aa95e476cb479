"""Column widths of a table, set from its cells rather than left to rich: rich narrows a table
too wide for the terminal by shrinking its wrapping columns without regard to their words (a
column of names can shrink to one character) and crops what still does not fit, often the
table's right edge when it is within a few cells of fitting."""
from __future__ import annotations

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text


def fitted_widths(headers: tuple[str, ...], wrapping: tuple[str, ...], rows: list[list[Text]],
                  width: int) -> list[int] | None:
    """Each column's width for a table of at most `width` cells with every cell whole: a
    column as wide as its widest cell where there is room, a wrapping column narrowed (down to
    its longest word) where there is not; None where even that does not fit."""
    narrowest, widest = [], []
    for i, header in enumerate(headers):
        texts = [row[i].plain for row in rows]
        widest.append(max([cell_len(header)] + [cell_len(t) for t in texts]))
        if header in wrapping:
            narrowest.append(max([cell_len(header)] + [cell_len(word) for t in texts
                                                        for word in t.split()]))
        else:
            narrowest.append(widest[-1])
    # Each column's padding (a space either side) and border, and the table's first border.
    spare = width - (3 * len(headers) + 1) - sum(narrowest)
    if spare < 0:
        return None
    fitted = list(narrowest)
    # The columns that need least to be whole on one line first: most cells then are.
    for i in sorted(range(len(headers)), key=lambda i: widest[i] - narrowest[i]):
        grow = min(spare, widest[i] - narrowest[i])
        fitted[i] += grow
        spare -= grow
    return fitted


def table_of(title: str, headers: tuple[str, ...], wrapping: tuple[str, ...],
             rows: list[list[Text]], widths: list[int] | None) -> Table:
    """The table: only the `wrapping` columns wrap; each column as wide as `widths` says
    (fitted_widths), or, where they are None, as rich makes it."""
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(headers):
        table.add_column(header, no_wrap=header not in wrapping,
                         width=None if widths is None else widths[i])
    for row in rows:
        table.add_row(*row)
    return table
