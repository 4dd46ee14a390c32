"""What a sync reports: each node's environment (:class:`NodeEnv`), then one line per distinct
environment and what differs between them (pure logic).

Nothing checks torch versions across ranks when a job starts (pytorch#174917): mismatches fail later
in obscure ways. So a difference is an error of the sync, named package by package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.view import Cell, CellLike

#: seeded by ``python -m venv`` (its version follows the node's Python patch release), not by the lock
IGNORED = frozenset({"pip"})


@dataclass
class NodeEnv:
    """A node's environment after the sync."""

    node: str
    os: str
    action: str  # unchanged | installed | updated | rebuilt | planned (a dry run's build)
    path: str  # the stable path (as configured; "~" is the node user's home)
    python_path: str  # the interpreter launch should run
    python: str  # its version
    installer: str | None  # what installed the current build (from its stamp)
    env_id: str | None
    packages: dict[str, str] = field(default_factory=dict)
    changes: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    wheels_pushed: int = 0
    round_trips: int = 1
    notes: list[str] = field(default_factory=list)
    #: what a build sends (``NodePlan.public_dict`` with the text the node's shell gets): planned by
    #: a dry run, applied by the real one; None when nothing was to change
    plan: dict[str, Any] | None = None
    #: installed from wheels this machine pushed because the node reached no index (why), or None
    offline_reason: str | None = None

    def row(self) -> tuple[CellLike, ...]:
        """The environment table's cells: what was done, the installer, Python, the build, changes."""
        style = {"unchanged": "green", "planned": "dim"}.get(self.action, "cyan")
        return (
            Cell(self.action, style),
            self.installer or "-",
            self.python,
            self.env_id or "-",
            self.changes_text(),
        )

    def plan_lines(self) -> list[str]:
        """A dry run's view of the node's environment: unchanged, or its build's plan."""
        head = f"# {self.node}: environment at {self.path} (python: {self.python_path})"
        if self.plan is None:
            return [f"{head}: {self.action}, build {self.env_id or '-'}: nothing to send"]
        from orchestrator.plans import plan_lines

        return [
            f"{head}: build {self.env_id} with {self.installer}, Python {self.python}",
            *plan_lines(self.plan, self.node),
        ]

    def changes_text(self) -> str:
        """The versions the sync changed, in a few words (``-``: unchanged)."""
        if self.action == "unchanged":
            return "-"
        if not self.changes:
            return "no version changed"
        parts = []
        for name, (old, new) in self.changes.items():
            if old is None:
                parts.append(f"+{name} {new}")
            elif new is None:
                parts.append(f"-{name} {old}")
            else:
                parts.append(f"{name} {old} -> {new}")
        shown = parts[:4]
        if len(parts) > 4:
            shown.append(f"+{len(parts) - 4} more")
        return ", ".join(shown)

    def public_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "path": self.path,
            "python_path": self.python_path,
            "python": self.python,
            "installer": self.installer,
            "env_id": self.env_id,
            "packages": dict(sorted(self.packages.items())),
            "changes": {k: list(v) for k, v in sorted(self.changes.items())},
            "wheels_pushed": self.wheels_pushed,
            "round_trips": self.round_trips,
            "notes": self.notes,
            "offline_fallback": self.offline_reason,
            **({"plan": self.plan} if self.plan is not None else {}),
        }


@dataclass(frozen=True)
class NodeVersions:
    node: str
    os: str
    python: str  # full version of the venv's interpreter
    packages: dict[str, str]


@dataclass
class EnvGroup:
    """Nodes whose environments are identical."""

    nodes: list[str]
    os: str
    python: str  # major.minor
    packages: dict[str, str]

    def describe(self, limit: int = 6) -> str:
        shown = sorted(self.packages.items())
        torch = [f"{n} {v}" for n, v in shown if n == "torch"]
        rest = [f"{n} {v}" for n, v in shown if n != "torch"]
        items = torch + rest
        extra = f", +{len(items) - limit} more" if len(items) > limit else ""
        return f"python {self.python}: " + ", ".join(items[:limit]) + extra


@dataclass
class EnvReport:
    groups: list[EnvGroup]
    #: package -> version ("-" when missing) -> nodes, for packages whose versions differ
    differing: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def mismatch(self) -> bool:
        return bool(self.differing)

    def describe_mismatch(self) -> list[str]:
        lines = []
        for name, versions in self.differing.items():
            parts = [f"{v} on {', '.join(nodes)}" for v, nodes in versions.items()]
            lines.append(f"{name}: " + "; ".join(parts))
        return lines


def _public(version: str) -> str:
    return version.split("+", 1)[0]


def summarize(envs: Sequence[NodeVersions]) -> EnvReport:
    """Group identical environments; list what differs.

    Nodes of one OS must match exactly (they got the same requirements). Across OSes (a per-OS
    override, e.g. CUDA wheels for Linux, others for Windows) only Python (major.minor) and torch's
    public version must match: ``2.13.0+cu124`` and ``2.13.0+cpu`` are one torch release.
    """
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], EnvGroup] = {}
    for env in envs:
        python = ".".join(env.python.split(".")[:2])
        packages = {n: v for n, v in env.packages.items() if n not in IGNORED}
        key = (env.os, python, tuple(sorted(packages.items())))
        group = groups.get(key)
        if group is None:
            groups[key] = EnvGroup([env.node], env.os, python, packages)
        else:
            group.nodes.append(env.node)
    ordered = sorted(groups.values(), key=lambda g: -len(g.nodes))
    report = EnvReport(ordered)
    _differences(report, ordered)
    return report


def _differences(report: EnvReport, groups: list[EnvGroup]) -> None:
    def record(name: str, by_version: dict[str, list[str]]) -> None:
        if len(by_version) > 1:
            merged = report.differing.setdefault(name, {})
            for version, nodes in by_version.items():
                merged.setdefault(version, [])
                merged[version].extend(n for n in nodes if n not in merged[version])

    pythons: dict[str, list[str]] = {}
    for group in groups:
        pythons.setdefault(group.python, []).extend(group.nodes)
    record("python", pythons)
    for os_name in sorted({g.os for g in groups}):
        same_os = [g for g in groups if g.os == os_name]
        if len(same_os) < 2:
            continue
        names = sorted({n for g in same_os for n in g.packages})
        for name in names:
            by_version: dict[str, list[str]] = {}
            for group in same_os:
                by_version.setdefault(group.packages.get(name, "-"), []).extend(group.nodes)
            record(name, by_version)
    if "torch" not in report.differing and any("torch" in g.packages for g in groups):
        torches: dict[str, list[str]] = {}
        for group in groups:
            torches.setdefault(_public(group.packages.get("torch", "-")), []).extend(group.nodes)
        record("torch", torches)
