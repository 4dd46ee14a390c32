"""What the time step reports: one :class:`NodeTime` per node (a row of the summary table, and of
``--json``), gathered in a :class:`TimeReport` for the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.executor import Outcome

__all__ = ["NodeTime", "TimeReport"]


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


@dataclass
class TimeReport:
    outcomes: list[Outcome[NodeTime]]  # one per node, inventory order
    max_offset_ms: float
    master: str
    dry_run: bool = False
    warnings: list[str] = field(default_factory=list)  # e.g. a worker whose own address disagrees

    @property
    def failed(self) -> bool:
        return any(not o.ok or (o.value is not None and o.value.problem) for o in self.outcomes)

    def public_dict(self) -> dict[str, Any]:
        return {
            "master": self.master,
            "max_offset_ms": self.max_offset_ms,
            "dry_run": self.dry_run,
            "warnings": self.warnings,
            "nodes": [
                {
                    "name": o.node,
                    "ok": o.ok and not (o.value and o.value.problem),
                    "error": None if o.error is None else {"message": o.error.message, "hint": o.error.hint},
                    **(o.value.public_dict() if o.value else {}),
                }
                for o in self.outcomes
            ],
        }
