"""What the time step reports: one :class:`NodeTime` per node (a row of the summary table, and of
``--json``), the value of each node's outcome in the step's one
:class:`~orchestrator.steps.contract.Report`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.view import Cell, CellLike

__all__ = ["NodeTime"]


@dataclass
class NodeTime:
    """What the step did and measured on one node (a row of the summary table)."""

    node: str
    role: str = "-"  # "server" (the master serving the workers), "client", "-" (not managed)
    daemon: str = "-"  # chrony, timesyncd, w32time, none
    # added, changed, unchanged, started, measured, restored, nothing to restore; "failed": configured
    # (see actions) but following no source (problem says why)
    state: str = "-"
    sources: list[str] = field(default_factory=list)  # what it is configured to follow (not: has)
    mode: str | None = None  # dropin, block, file (where our chrony directives went)
    path: str | None = None
    selected: str | None = None  # chrony's selected source (^*)
    chrony_offset_ms: float | None = None  # chrony: this node minus its selected source
    offset_ms: float | None = None  # this node minus the master, over the connection (as `check`)
    offset_error_ms: float | None = None  # +- of offset_ms (half the round trips)
    clock_control: bool | None = None  # False: chronyd -x (measures only; shared kernel clock)
    actions: list[str] = field(default_factory=list)
    diff: str = ""  # --dry-run: the configuration diff
    script: str = ""  # --dry-run: what would run (as root)
    problem: str | None = None  # why this node fails the step, with what to do

    @property
    def status(self) -> str:
        return self.state

    def public_dict(self) -> dict[str, Any]:
        return asdict(self)

    def source(self, *, dry_run: bool) -> str:
        """What the node follows: chrony's selected source (w32time: the peer it measured), a serving
        master's own clock, the configured sources only where nothing was awaited (a dry run); else
        ``none`` (configured but following nothing: its problem says why), never a source it does not
        have."""
        if self.selected:
            return self.selected
        if self.sources == ["local clock"]:
            return "local clock"
        if dry_run and self.sources:
            return ", ".join(self.sources) + " (planned)"
        return "none" if self.sources else "-"

    def row(self, *, dry_run: bool) -> tuple[CellLike, ...]:
        """The time table's cells: role, daemon (``-x``: measures only), source, both offsets, state."""
        return (
            self.role,
            self.daemon + ("" if self.clock_control is not False else " (-x)"),
            self.source(dry_run=dry_run),
            _ms(self.chrony_offset_ms),
            _ms(self.offset_ms, self.offset_error_ms),
            Cell(self.state, "red" if self.problem else "green"),
        )


def _ms(value: float | None, error: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:+.3f}"
    return f"{text} ±{error:.3f}" if error is not None else text
