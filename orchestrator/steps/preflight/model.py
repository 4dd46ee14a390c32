"""Verdicts of the preflight: one per node and check, each with a reason and a fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
