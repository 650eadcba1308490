"""Terminal output shared by the commands (`render`, `status`, `diff`, and `doctor` to come): tables
and live progress drawn with `rich` when the stream is a terminal, plain text otherwise.

* Plain text (a pipe, a file, CI logs) is what scripts and tests read: aligned columns, no escape
  codes, no progress lines. `rich` is not even imported then (status bounds its own start time).
* On a terminal, `rich` draws the tables and a transient progress bar or spinner on stderr.
  `NO_COLOR` (any value) turns colour off (rich honours it); `force_terminal=True` draws as for a
  terminal whatever the stream is (tests), `False` never.
* Every cell is passed to rich as plain `Text`, never as markup: a value an endpoint or a stack
  file supplied (`[bold]`, `[link=...]`) is shown as written.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional, Sequence, TextIO, Union

# Cell text -> rich style, for the few words whose colour carries meaning.
STATE_STYLES = {"ok": "green", "FAIL": "bold red", "outage": "bold red", "restart": "yellow", "stop": "red",
                "start": "green", "keeps serving": "green", "keeps serving (rolling)": "green"}


@dataclass(frozen=True)
class Table:
    head: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]
    title: str = ""
    styles: Mapping[str, str] = field(default_factory=lambda: STATE_STYLES)


Block = Union[str, Table]  # a line (or lines) of text, or a table


def is_terminal(stream: TextIO, force_terminal: Optional[bool] = None) -> bool:
    if force_terminal is not None:
        return force_terminal
    return bool(getattr(stream, "isatty", lambda: False)())


def columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The plain form of a table: left-aligned columns two spaces apart, no trailing blanks."""
    every = [tuple(head), *(tuple(r) for r in rows)]
    widths = [max(len(r[i]) for r in every) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in every]


def plain(blocks: Sequence[Block]) -> str:
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            if b.title:
                out.append(b.title)
            out += columns(b.head, b.rows)
        else:
            out.append(b)
    return "\n".join(out)


def console(stream: TextIO, force_terminal: Optional[bool] = None):
    from rich.console import Console

    # no_color left to rich: it reads NO_COLOR (set and not empty, as no-color.org says).
    return Console(file=stream, force_terminal=force_terminal, highlight=False, emoji=False, markup=False,
                   soft_wrap=False)


def _rich_table(t: Table):
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    table = RichTable(title=Text(t.title, style="bold") if t.title else None, title_justify="left",
                      box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for h in t.head:
        table.add_column(Text(h), overflow="fold")
    for row in t.rows:
        table.add_row(*(Text(c, style=t.styles.get(c, "")) for c in row))
    return table


def write(blocks: Sequence[Block], stream: Optional[TextIO] = None, *, force_terminal: Optional[bool] = None) -> None:
    """`blocks` on `stream`: rich tables on a terminal, `plain(blocks)` otherwise."""
    stream = stream or sys.stdout
    if not is_terminal(stream, force_terminal):
        stream.write(plain(blocks) + "\n")
        stream.flush()
        return
    from rich.text import Text

    con = console(stream, force_terminal=True if force_terminal is None else force_terminal)
    for b in blocks:
        con.print(_rich_table(b) if isinstance(b, Table) else Text(b))


@contextmanager
def progress(description: str, stream: Optional[TextIO] = None, *,
             force_terminal: Optional[bool] = None) -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar `update(done, total)` on `stream` (stderr) when it is a terminal;
    a no-op otherwise. The bar is gone when the block ends."""
    stream = stream or sys.stderr
    if not is_terminal(stream, force_terminal):
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    con = console(stream, force_terminal=True if force_terminal is None else force_terminal)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=con, transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@contextmanager
def phases(stream: Optional[TextIO] = None, *, force_terminal: Optional[bool] = None) -> Iterator[Callable[[str], None]]:
    """A transient spinner `say(what)` naming the current phase of a long step, on a terminal only."""
    stream = stream or sys.stderr
    if not is_terminal(stream, force_terminal):
        yield lambda what: None
        return
    con = console(stream, force_terminal=True if force_terminal is None else force_terminal)
    with con.status("") as status:
        yield lambda what: status.update(what)


__all__ = ["Table", "Block", "STATE_STYLES", "is_terminal", "columns", "plain", "console", "write", "progress",
           "phases"]
