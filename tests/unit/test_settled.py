"""An unchanged re-run is one line per phase (orchestrator/settled.py): the line appears only when a
phase changed nothing, failed nowhere and has nothing to warn about; anything else keeps its tables."""

from __future__ import annotations

from typing import Any

from orchestrator.errors import UnreachableError
from orchestrator.executor import GroupResult, Outcome
from orchestrator.plans import NodePlan, Run
from orchestrator.settled import settled_line
from orchestrator.steps.codesync.sync import CodeSyncResult
from orchestrator.steps.contract import Report
from orchestrator.steps.envsync.report import NodeEnv
from orchestrator.steps.firewall import FirewallResult
from orchestrator.steps.sync import Choice, SyncReport
from orchestrator.steps.timesync.report import NodeTime

NODES = ("node1", "node2", "node3")


def _report(step: str, values: dict[str, Any], **more: Any) -> Report[Any]:
    outcomes = GroupResult(Outcome(n, v, None, 0.01) for n, v in values.items())
    return Report(step=step, outcomes=outcomes, **more)


def _code(**changes: Any) -> CodeSyncResult:
    return CodeSyncResult(dest="/w/code", files=12, **changes)


def _env(action: str = "unchanged") -> NodeEnv:
    return NodeEnv(
        "n", "linux", action, "~/env", "~/env/bin/python", "3.11.7", "uv", "e1", {"torch": "2.13.0"}
    )


def _sync(code: dict[str, CodeSyncResult], env: dict[str, NodeEnv] | None = None) -> SyncReport:
    report = SyncReport(Choice(env=env is not None, code=True, from_master=False), dry_run=False)
    report.code = [Outcome(n, v, None, 0.01) for n, v in code.items()]
    report.env = [Outcome(n, v, None, 0.01) for n, v in (env or {}).items()]
    return report


def test_an_unchanged_sync_is_one_line_and_any_moved_file_shows_the_table() -> None:
    same = _sync({n: _code() for n in NODES}, {n: _env() for n in NODES})
    assert settled_line("sync", same) == (
        "sync: environment unchanged on 3 nodes; code unchanged on 3 nodes (12 files)"
    )
    for change in ({"added": ["a.py"]}, {"deleted": ["old.py"]}, {"kept": ["ckpt.pt"]}):
        moved = _sync({"node1": _code(), "node2": _code(**change)})
        assert settled_line("sync", moved) is None, change
    rebuilt = _sync({n: _code() for n in NODES}, {"node1": _env(), "node2": _env("rebuilt")})
    assert settled_line("sync", rebuilt) is None
    down = _sync({"node1": _code()})
    down.code.append(Outcome("node2", None, UnreachableError("node node2: connection refused"), 0.1))
    assert settled_line("sync", down) is None


def test_a_firewall_with_every_rule_in_place_is_one_line_naming_it() -> None:
    nft = {n: FirewallResult("nftables", ["input"], unchanged=3) for n in NODES}
    assert settled_line("firewall", _report("firewall", nft)) == (
        "firewall: nothing to change on 3 nodes (nftables on every node)"
    )
    bare = {n: FirewallResult("none", []) for n in NODES}
    assert settled_line("firewall", _report("firewall", bare)) == (
        "firewall: nothing to change on 3 nodes (no active firewall on any node)"
    )
    mixed = {**nft, "node3": FirewallResult("none", [])}
    assert settled_line("firewall", _report("firewall", mixed)) == (
        "firewall: nothing to change on 3 nodes (nftables on 2, no active firewall on 1)"
    )
    opened = {**nft, "node2": FirewallResult("nftables", ["input"], added=2, commands=["nft ..."])}
    assert settled_line("firewall", _report("firewall", opened)) is None
    planned = _report("firewall", nft, plans={"node1": NodePlan("node1", [Run("nft -f -", become=True)])})
    assert settled_line("firewall", planned) is None
    assert settled_line("firewall", _report("firewall", nft, warnings=["ufw is inactive"])) is None
    assert settled_line("firewall", _report("firewall", nft, dry_run=True)) is None


def test_time_in_sync_and_unchanged_is_one_line_with_the_largest_offset() -> None:
    values = {
        n: NodeTime(n, role="client", daemon="chrony", state="unchanged", offset_ms=off)
        for n, off in zip(NODES, (0.0, -2.25, 1.5), strict=True)
    }
    data = {"master": "node1", "max_offset_ms": 100.0}
    assert settled_line("ntp", _report("ntp", values, data=data)) == (
        "time: unchanged on 3 nodes, following node1; largest offset from the master 2.2 ms (limit 100 ms)"
    )
    values["node2"] = NodeTime("node2", state="changed")
    assert settled_line("ntp", _report("ntp", values, data=data)) is None
    values["node2"] = NodeTime("node2", state="unchanged", problem="chrony selected no source")
    assert settled_line("ntp", _report("ntp", values, data=data, failing=["node2"])) is None
