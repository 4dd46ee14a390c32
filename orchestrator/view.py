"""What a human reads of a report, as data: a table's title, columns and rows of cells, each cell's
words and style. A step's verdict says what its row shows (``row()``, beside ``public_dict()`` for
``--json``); cli/report.py draws a :class:`View` (rich) the one way every command does. No terminal
here, and nothing decides what to show twice."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import HostKeyUnknownError, said_once
from orchestrator.neutralise import one_line

if TYPE_CHECKING:
    from orchestrator.executor import Outcome


@dataclass(frozen=True)
class Cell:
    """A table cell: its words (node text too: drawn as text, never read as markup) and a style
    (rich's words: "green", "red bold", "dim"; "" none)."""

    text: str
    style: str = ""


CellLike = Cell | str


def red(text: str) -> Cell:
    return Cell(text, "red")


@dataclass
class View:
    """One table: ``fold``: long cells wrap inside their column (else rich's default); ``right``: the
    columns aligned right; ``stderr``: a summary drawn on stderr (the command streamed lines on
    stdout); ``caption``: a line under it."""

    title: str
    columns: Sequence[str]
    rows: list[tuple[tuple[CellLike, ...], str]] = field(default_factory=list)
    fold: bool = False
    right: Iterable[str] = ()
    no_wrap: bool = False
    stderr: bool = False
    caption: str = ""
    #: a column's own options (rich's ``add_column`` keywords): status's last line
    options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, *cells: CellLike, style: str = "") -> None:
        """A row (``style``: the whole row's)."""
        self.rows.append((cells, style))


@dataclass(frozen=True)
class Said:
    """A line a human reads, as data: ``how`` "info" (plain, stderr), "note" (dim), "warn",
    "error", "hint" ("hint: " before it) or "out" (stdout: a dry run's text, a run id); ``parts``:
    styled pieces instead of ``text`` (check's verdicts), ``style`` the whole line's."""

    how: str
    text: str = ""
    parts: tuple[Cell, ...] = ()
    style: str = ""


def failures(outcomes: Iterable[Outcome[Any]]) -> list[Said]:
    """What failed, once (an error said already is not said again): one line per failure, one for a
    failure many nodes share, and unknown host keys as one block, since they need one decision."""
    unknown: list[HostKeyUnknownError] = []
    failed = []
    for outcome in outcomes:
        if isinstance(outcome.error, HostKeyUnknownError) and outcome.error.host:
            unknown.append(outcome.error)
        elif outcome.error is not None and not outcome.error.shown:
            failed.append(outcome.error)
            outcome.error.shown = True
    # one line each: what a node sent (a file name in "cannot copy ...") cannot start a line of ours
    said = [Said("error", one_line(line)) for line in said_once(failed)]
    if not unknown:
        return said
    files = sorted({e.known_hosts for e in unknown})
    said.append(
        Said("error", f"{len(unknown)} node(s) offered a host key that is not in {', '.join(files)}:")
    )
    width = max(len(e.node or "") for e in unknown)
    said += [
        Said("info", f"  {(e.node or '').ljust(width)}  {e.host}  {e.key_type} {e.fingerprint}")
        for e in unknown
    ]
    # the command for the key type each node actually offered (paramiko: imported by SSH runs only)
    from orchestrator.transports.known_hosts import how_to_compare

    return [*said, Said("info", how_to_compare(e.key_type for e in unknown))]


def node_view(
    title: str,
    columns: Sequence[str],
    outcomes: Iterable[Outcome[Any]],
    row: Callable[[Any], Sequence[CellLike]],
    *,
    failed: Callable[[Outcome[Any]], str] | None = None,
    status_column: int = 1,
    timed: bool = False,
    **options: Any,
) -> View:
    """A table with a row per node: ``node``, then ``row(value)`` for a node with a verdict; a node
    without one has its few words (``failed(outcome)``, default: its error's ``status``, else
    "failed") in red in column ``status_column`` and "-" in the others. ``timed``: the last column
    is the node's time (``1.23s``)."""
    view = View(title, columns, **options)
    for o in outcomes:
        time = (f"{o.duration:.2f}s",) if timed else ()
        if o.value is None:
            words = failed(o) if failed is not None else getattr(o.error, "status", None) or "failed"
            cells: list[CellLike] = ["-"] * (len(columns) - 1 - len(time))
            cells[status_column - 1] = red(words)
            view.add(o.node, *cells, *time)
        else:
            view.add(o.node, *row(o.value), *time)
    return view


def human_bytes(size: float) -> str:
    """A size as every table and progress line shows it: binary units (B, KiB, MiB, GiB, TiB), one
    decimal where it says something (``512 B``, ``4 KiB``, ``1.5 MiB``)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        shown = round(value) if unit == "B" else round(value, 1)
        if abs(shown) < 1024:  # as it would show: 1023.96 KiB is 1 MiB, not "1024 KiB"
            return f"{shown:.0f} B" if unit == "B" else f"{f'{shown:.1f}'.removesuffix('.0')} {unit}"
        value /= 1024
    return f"{f'{value:.1f}'.removesuffix('.0')} TiB"
