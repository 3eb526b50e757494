"""The one table of labkit: it prints as text in a terminal and renders as HTML in a notebook.

Every ``*_table`` function in labkit returns one.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from labkit._validate import names, shown


@dataclass(frozen=True)
class Table:
    """Rows of strings with a header; `print()` it or let Jupyter render it.

    A table with no rows prints its header and "(no rows)":

    >>> print(Table(("op", "bytes"), ()))
    op  bytes
    --  -----
    (no rows)
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    title: str = ""

    def __post_init__(self):
        columns = _strings("columns", self.columns, "a list of column names")
        if isinstance(self.rows, (str, bytes)) or not hasattr(self.rows, "__iter__"):
            raise TypeError(f"rows must be a list of rows (each a list of strings); got {_kind(self.rows)}")
        rows = tuple(_strings("a row", row, "a list of strings") for row in self.rows)
        for row in rows:
            if len(row) != len(columns):
                raise ValueError(f"row {shown(row)} has {len(row)} cells; the header has {len(columns)} columns")
        if not isinstance(self.title, str):
            raise TypeError(f"title must be a string; got {_kind(self.title)}")
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "rows", rows)

    @classmethod
    def from_dicts(cls, rows, columns=None, title: str = "") -> "Table":
        """A table of dicts (one per row); `columns` picks and orders the keys (default: the first row's).

        >>> print(Table.from_dicts([{"op": "all-reduce", "bytes": 128}]))
        op          bytes
        ----------  -----
        all-reduce  128
        """
        if isinstance(rows, (str, bytes, dict)) or not hasattr(rows, "__iter__"):
            raise TypeError(f"rows must be a list of dicts (one per row); got {_kind(rows)}")
        rows = list(rows)
        for r in rows:
            if not isinstance(r, dict):
                raise TypeError(f"rows must be a list of dicts (one per row); got a row of {_kind(r)}")
        if columns is None:
            columns = [str(k) for k in rows[0]] if rows else []
        else:
            columns = names("columns", columns)
        return cls(tuple(columns), tuple(tuple(_cell(r.get(c, "")) for c in columns) for r in rows), title)

    def column(self, name: str) -> list[str]:
        if not isinstance(name, str):
            raise TypeError(f"name must be a column name (a string); got {_kind(name)}")
        if name not in self.columns:
            raise ValueError(f"name {shown(name)} is not a column; columns are {', '.join(self.columns)}")
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def __str__(self) -> str:
        widths = [max([len(c), *(len(r[i]) for r in self.rows)]) for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = [self.title] if self.title else []
        out += [line(self.columns), line("-" * w for w in widths)]
        out += [line(r) for r in self.rows] or [NO_ROWS]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        if not self.rows:
            body = f'<tr><td colspan="{max(len(self.columns), 1)}">{NO_ROWS}</td></tr>'
        caption = f"<caption>{esc(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


NO_ROWS = "(no rows)"
"""What a table with no rows shows under its header."""


def _strings(what: str, value, wanted: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{what} must be {wanted}; got {_kind(value)}")
    cells = tuple(value)
    for c in cells:
        if not isinstance(c, str):
            raise TypeError(f"{what} must be {wanted}; got a cell of {_kind(c)} (use str() on it)")
    return cells


def _kind(value) -> str:
    return f"{type(value).__name__} {shown(value)}"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


__all__ = ["Table"]
