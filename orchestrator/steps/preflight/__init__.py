"""The preflight (`bootstrap check`): will this cluster train? Each cause of a rendezvous hang, found first.

Phases: facts (one round trip per node, shared with `inspect`), clock samples, reachability (real
listeners and connections between the nodes), then pure decisions (checks.py).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import CommandFailedError
from orchestrator.executor import Outcome
from orchestrator.facts.network import Addresses, DiskFree, HostnameAddress, Interfaces, MasterRoute
from orchestrator.facts.windows import WindowsNetwork, windows_network_facts
from orchestrator.steps.inspect import NodeFacts as InspectedNode
from orchestrator.steps.inspect import inspect, interpreter_for, training_python
from orchestrator.steps.preflight.checks import (
    ClockSample,
    NodeFacts,
    check_clocks,
    check_interface,
    check_resources,
    check_versions,
    check_windows,
    choose_backend,
    is_native_windows,
    version_table,
)
from orchestrator.steps.preflight.model import CHECKS, Verdict, warn, worst

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
    """The facts the checks need beyond `inspect`'s, gathered in the same round trip. Native Windows
    nodes: the route to the master and the adapters, in PowerShell (facts/windows.py)."""
    if is_native_windows(node):
        return windows_network_facts(master.host)
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
        lines = result.stdout.strip().splitlines()
        if not result.ok or not lines:
            continue
        try:
            remote = float(lines[-1])  # the last line: a chatty login script may print before
        except ValueError:
            continue  # busybox date without %N prints "…%N": no sub-second answer
        sample = ClockSample(offset=remote - (before + after) / 2, rtt=after - before)
        if best is None or sample.rtt < best.rtt:
            best = sample
    if best is None:
        raise CommandFailedError("`date +%s.%N` gave no usable answer (GNU date needed for the clock check)")
    return best


def _node_facts(node: Node, inspected: InspectedNode) -> NodeFacts:
    values, errors = inspected.facts.values, inspected.facts.errors
    network = values.get("adapters")
    if isinstance(network, WindowsNetwork):  # native Windows: the same model as `ip addr`/`ip link`
        values = {**values, "addresses": network.addresses, "interfaces": network.interfaces}
    return NodeFacts(
        torch_error=errors.get("torch"),
        python_error=errors.get("python"),
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
        windows=values.get("windows"),
        wsl=values.get("wsl"),
        down=network.down if isinstance(network, WindowsNetwork) else (),
    )


def check_interfaces(facts: list[NodeFacts], master: str, *, single: bool) -> dict[str, Verdict]:
    """Interface verdicts for every node, the master first: the others are judged against the address
    their peers dial, which on the master may differ from what its own name resolves to there (its
    own /etc/hosts can say 127.0.1.1 while the peers use DNS)."""
    dialed = Counter(
        f.route.address for f in facts if f.node.name != master and f.route and f.route.address
    ).most_common(1)
    consensus = dialed[0][0] if dialed else None
    verdicts: dict[str, Verdict] = {}
    master_address = consensus
    for f in facts:
        if f.node.name == master:
            verdicts[master] = check_interface(f, single_node=single, peers_see_master_at=consensus)
            master_address = verdicts[master].data.get("master_address") or consensus
    for f in facts:
        if f.node.name != master:
            verdicts[f.node.name] = check_interface(f, single_node=single, peers_see_master_at=master_address)
    return verdicts


def gather_node_facts(
    session: Session, inventory: Inventory
) -> tuple[list[Outcome[InspectedNode]], list[NodeFacts]]:
    """Connect and gather `inspect`'s facts plus the preflight's, one round trip per node."""
    master = inventory.master_node
    inspected = session.map(
        lambda node, transport: inspect(
            node, transport, preflight_facts(node, master), python=training_python(node, inventory)
        ),
        step="check",
        connect=False,
    )
    facts = [_node_facts(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    return inspected, facts


def run_preflight(session: Session, inventory: Inventory) -> PreflightReport:
    """Every check on every selected node. Unreachable nodes have no verdicts (their error says why)."""
    master = inventory.master_node
    inspected, facts = gather_node_facts(session, inventory)
    reachable = [(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    names = {node.name for node, _ in reachable}

    reachable_nodes = [node for node, _ in reachable]
    clocks = session.map(lambda node, t: sample_clock(t), step="clock", nodes=reachable_nodes)
    samples = {o.node: o.value for o in clocks}

    verdicts: dict[str, dict[str, Verdict]] = {name: {} for name in names}
    for name, verdict in check_versions(facts, master.name).items():
        verdicts[name]["versions"] = verdict
    backend, why, backend_verdicts = choose_backend(inventory.cluster, facts)
    for name, verdict in backend_verdicts.items():
        verdicts[name]["backend"] = verdict
    single = len(inventory.nodes) == 1
    for name, verdict in check_interfaces(facts, master.name, single=single).items():
        verdicts[name]["interface"] = verdict
    for f in facts:
        verdicts[f.node.name]["resources"] = check_resources(f)
        windows_verdict = check_windows(f, facts)
        if windows_verdict is not None:
            verdicts[f.node.name]["windows"] = windows_verdict
    if master.name not in samples or samples[master.name] is None:
        why_not = (
            f"the master {master.name} is not selected or did not answer"
            if master.name not in names
            else f"`date` failed on the master {master.name}"
        )
        for name in names:
            verdicts[name]["clock"] = warn("clock", f"not measured: {why_not}", "fix that, then rerun")
    else:
        full = {name: samples.get(name) for name in names}
        elastic = inventory.cluster.train.elastic
        for name, verdict in check_clocks(full, master.name, elastic=elastic).items():
            verdicts[name]["clock"] = verdict

    if master.name in names:
        from orchestrator.steps.preflight.reachability import ReachNode, check_reachability

        # a single node too: torchrun binds the rendezvous port there, so "port busy" matters
        reach_nodes = [
            ReachNode(
                name=node.name,
                transport=session.transport(node),
                python=interpreter_for(node),
                address=verdicts[node.name]["interface"].data.get("source") or node.host,
            )
            for node, _ in reachable
            if not single or node.name == master.name
        ]
        if single:
            reach_nodes = [replace(r, address="127.0.0.1") for r in reach_nodes]
        for name, verdict in check_reachability(reach_nodes, master.name, inventory.cluster.port).items():
            verdicts[name]["reachability"] = verdict
        missing = [n.name for n in session.nodes if n.name not in names]
        if missing:
            # a node that never answered was never probed: an "ok" mesh would overstate it
            for name in names:
                v = verdicts[name]["reachability"]
                if v.level == "ok":
                    verdicts[name]["reachability"] = warn(
                        "reachability",
                        f"{v.reason}; not tested with {', '.join(missing)} (unreachable)",
                        "fix the connection to those nodes, then rerun",
                        **v.data,
                    )
    else:
        for name in names:
            verdicts[name]["reachability"] = warn(
                "reachability",
                f"not checked: the master {master.name} is not selected or did not answer",
                "include the master in --nodes and make it reachable",
            )

    ordered = {name: {c: verdicts[name][c] for c in CHECKS if c in verdicts[name]} for name in names}
    return PreflightReport(
        backend=backend,
        backend_reason=why,
        inspected=inspected,
        verdicts=ordered,
        versions=version_table(facts),
    )
