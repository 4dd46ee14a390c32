"""Verdicts of the preflight: one per node and check, each with a reason and a fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.view import Cell, View

if TYPE_CHECKING:
    from orchestrator.inventory import Node

Level = Literal["ok", "warn", "fail"]

#: the checks, in the order the table shows them
CHECKS = (
    "versions",
    "backend",
    "windows",
    "interface",
    "reachability",
    "clock",
    "resources",
    "workdir",
    "sudo",
)

_RANK = {"ok": 0, "warn": 1, "fail": 2}


@dataclass
class Verdict:
    """What one check concluded about one node."""

    check: str
    level: Level
    reason: str  # one line a user reads in the details under the table
    fix: str | None = None  # what to do about it (None when ok)
    data: dict[str, Any] = field(default_factory=dict)  # every measured value, for --json

    def public_dict(self) -> dict[str, Any]:
        return {"level": self.level, "reason": self.reason, "fix": self.fix, "data": self.data}


def worst(levels: list[Level]) -> Level:
    return max(levels, key=lambda level: _RANK[level], default="ok")


def ok(check: str, reason: str, **data: Any) -> Verdict:
    return Verdict(check, "ok", reason, None, data)


def warn(check: str, reason: str, fix: str, **data: Any) -> Verdict:
    return Verdict(check, "warn", reason, fix, data)


def fail(check: str, reason: str, fix: str, **data: Any) -> Verdict:
    return Verdict(check, "fail", reason, fix, data)


#: a check's level as the table and the lines under it show it: its words and style
LEVEL_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "red bold")}


def checks_view(nodes: Sequence[Node], backend: str, verdicts: Mapping[str, Mapping[str, Verdict]]) -> View:
    """Every node's level for every check (an unreachable node: "-" everywhere)."""
    view = View(f"preflight: backend {backend}", ("node", *CHECKS))
    for node in nodes:
        checks = verdicts.get(node.name, {})
        levels = [checks[c].level if c in checks else None for c in CHECKS]
        view.add(node.name, *(Cell(*LEVEL_STYLE[v]) if v else Cell("-", "dim") for v in levels))
    return view


def versions_view(versions: Mapping[str, Mapping[str, str | None]]) -> View:
    """Versions side by side when they differ: the first thing to fix."""
    view = View("versions differ", ("node", "python", "torch", "cuda"))
    for node, v in versions.items():
        view.add(node, *(v.get(k) or "-" for k in ("python", "torch", "cuda")))
    return view
