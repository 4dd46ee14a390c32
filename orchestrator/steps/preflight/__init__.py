"""The preflight (`bootstrap check`): will this cluster train? Each cause of a rendezvous hang, found first.

Phases: facts (one round trip per node, shared with `inspect`), clock samples, reachability (real
listeners and connections between the nodes), then pure decisions (checks.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.executor import Outcome
from orchestrator.facts.network import Addresses, DiskFree, HostnameAddress, Interfaces, MasterRoute
from orchestrator.steps.inspect import NodeFacts as InspectedNode
from orchestrator.steps.inspect import inspect, interpreter_for
from orchestrator.steps.preflight.checks import (
    ClockSample,
    NodeFacts,
    check_clocks,
    check_interface,
    check_resources,
    check_versions,
    choose_backend,
    version_table,
)
from orchestrator.steps.preflight.model import CHECKS, Verdict, ok, warn, worst

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

DEFAULT_WORKDIR = "~/cluster-bootstrap"
CLOCK_SAMPLES = 3


@dataclass
class PreflightReport:
    backend: str
    backend_reason: str
    inspected: list[Outcome[InspectedNode]]  # connection + facts per node, inventory order
    verdicts: dict[str, dict[str, Verdict]]  # node -> check -> verdict (reachable nodes only)
    versions: dict[str, dict[str, str | None]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(v.level == "fail" for checks in self.verdicts.values() for v in checks.values())

    def level(self, node: str) -> str:
        checks = self.verdicts.get(node)
        return worst([v.level for v in checks.values()]) if checks else "fail"

    def public_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "versions": self.versions,
            "checks": {
                node: {name: v.public_dict() for name, v in checks.items()}
                for node, checks in self.verdicts.items()
            },
        }


def preflight_facts(node: Node, master: Node) -> list[Any]:
    """The facts the checks need beyond `inspect`'s, gathered in the same round trip."""
    return [
        MasterRoute(master.host),
        Addresses(),
        Interfaces(),
        HostnameAddress(),
        DiskFree(node.workdir or DEFAULT_WORKDIR),
    ]


def sample_clock(transport: Transport) -> ClockSample:
    """Offset of the node's wall clock from ours, corrected by half the round trip; best of a few."""
    best: ClockSample | None = None
    for _ in range(CLOCK_SAMPLES):
        before = time.time()
        result = transport.run("date +%s.%N", timeout=10)
        after = time.time()
        if not result.ok:
            continue
        try:
            remote = float(result.stdout.strip())
        except ValueError:
            continue
        sample = ClockSample(offset=remote - (before + after) / 2, rtt=after - before)
        if best is None or sample.rtt < best.rtt:
            best = sample
    if best is None:
        raise ValueError("date +%s.%N gave no usable answer")
    return best


def _node_facts(node: Node, inspected: InspectedNode) -> NodeFacts:
    values = inspected.facts.values
    return NodeFacts(
        node=node,
        python=values.get("python"),
        torch=values.get("torch"),
        gpus=values.get("gpus"),
        route=values.get("route"),
        addresses=values.get("addresses") or (),
        interfaces=values.get("interfaces") or (),
        hostname=values.get("hostname"),
        hostname_address=values.get("hostname_address"),
        disk=values.get("disk"),
    )


def run_preflight(session: Session, inventory: Inventory) -> PreflightReport:
    """Every check on every selected node. Unreachable nodes have no verdicts (their error says why)."""
    master = inventory.master_node
    inspected = session.map(
        lambda node, transport: inspect(node, transport, preflight_facts(node, master)),
        step="check",
        connect=False,
    )
    reachable = [(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    facts = [_node_facts(node, value) for node, value in reachable]
    names = {node.name for node, _ in reachable}

    clocks = session.map(lambda node, t: sample_clock(t), step="clock")
    samples = {o.node: o.value for o in clocks if o.node in names}
    master_sample = samples.get(master.name)
    if master.name not in names:
        # the master was not selected (--nodes) or did not answer: measure against it anyway
        master_sample = None

    verdicts: dict[str, dict[str, Verdict]] = {name: {} for name in names}
    for name, verdict in check_versions(facts, master.name).items():
        verdicts[name]["versions"] = verdict
    backend, why, backend_verdicts = choose_backend(inventory.cluster, facts)
    for name, verdict in backend_verdicts.items():
        verdicts[name]["backend"] = verdict
    single = len(inventory.nodes) == 1
    for f in facts:
        verdicts[f.node.name]["interface"] = check_interface(f, single_node=single)
        verdicts[f.node.name]["resources"] = check_resources(f)
    if master_sample is None:
        for name in names:
            verdicts[name]["clock"] = warn(
                "clock",
                f"master {master.name} not measured",
                "include the master (--nodes) and make it reachable",
            )
    else:
        for name, verdict in check_clocks(samples, master.name).items():
            verdicts[name]["clock"] = verdict

    if len(reachable) > 1 and master.name in names:
        from orchestrator.steps.preflight.reachability import ReachNode, check_reachability

        reach_nodes = [
            ReachNode(
                name=node.name,
                transport=session.transport(node),
                python=interpreter_for(node),
                address=verdicts[node.name]["interface"].data.get("source") or node.host,
            )
            for node, _ in reachable
        ]
        for name, verdict in check_reachability(reach_nodes, master.name, inventory.cluster.port).items():
            verdicts[name]["reachability"] = verdict
    else:
        for name in names:
            verdicts[name]["reachability"] = (
                ok("reachability", "single node: nothing to reach")
                if single
                else warn(
                    "reachability", f"master {master.name} not checked", "fix the master's connection first"
                )
            )

    ordered = {name: {c: verdicts[name][c] for c in CHECKS if c in verdicts[name]} for name in names}
    return PreflightReport(
        backend=backend,
        backend_reason=why,
        inspected=inspected,
        verdicts=ordered,
        versions=version_table(facts),
    )
