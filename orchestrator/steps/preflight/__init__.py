"""The preflight (`bootstrap check`): will this cluster train? Each cause of a rendezvous hang, found first.

Per Linux node, one round trip: the runner's read of its facts (:func:`facts_read_of`: `inspect`'s
and the preflight's, whether commands can become root among them; none when the session holds them)
sent by ``early.first_round`` with a clock sample first, then the node's workdir marker, its
reachability listener, the markers it sees (rounds.py). In the main pipeline that round trip is the
first command's, begun before the setup phases (early.py). Windows nodes: their facts (facts/windows.py),
then a listener of their own. Then the connectors of the reachability mesh, which sample the clocks
once more (reachability.py), and the pure decisions (checks.py, shared_fs.py), judged per node by the
runner step :class:`Preflight`: one Report."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError, CommandFailedError, ExitCode
from orchestrator.executor import GroupResult, Outcome
from orchestrator.facts.base import FactSet, Read, facts_read, read_script
from orchestrator.facts.linux import BecomeRoot, linux_facts
from orchestrator.facts.network import Addresses, DiskFree, HostnameAddress, Interfaces, MasterRoute
from orchestrator.facts.windows_network import WindowsNetwork, windows_network_facts
from orchestrator.plans import NodePlan
from orchestrator.runner import Reach, gather_reads, run_step
from orchestrator.runs.layout import workdir_for
from orchestrator.steps.addresses import (
    MasterIdentity,
    Reached,
    master_identity,
    reached_nodes,
    reached_of,
)
from orchestrator.steps.contract import ClusterFacts, Report, Step
from orchestrator.steps.node_facts import (
    InspectedNode,
    facts_key,
    facts_plan,
    facts_view,
    inspect_once,
    interpreter_for,
    training_python,
)
from orchestrator.steps.preflight.checks import (
    ClockSample,
    PreflightFacts,
    check_clocks,
    check_interface,
    check_resources,
    check_versions,
    check_windows,
    choose_backend,
    is_native_windows,
    version_table,
)
from orchestrator.steps.preflight.early import adopt, end_rounds, first_round, mesh_plan, node_round, take
from orchestrator.steps.preflight.model import (
    CHECKS,
    LEVEL_STYLE,
    Verdict,
    checks_view,
    versions_view,
    warn,
    worst,
)
from orchestrator.steps.preflight.privilege import check_root_access
from orchestrator.steps.preflight.reachability import (
    LISTEN_HOLD,
    MeshPlan,
    ReachNode,
    check_reachability,
    inbox_command,
    probe_command,
)
from orchestrator.steps.preflight.rounds import CLOCK as CLOCK  # the time step forgets it
from orchestrator.steps.preflight.rounds import (
    FACTS_TIMEOUT,
    MARK,
    MARKS,
    NodeRound,
    parse_listing,
)
from orchestrator.steps.preflight.shared_fs import (
    check_shared_workdirs,
    new_token,
    workdir_verdicts,
)
from orchestrator.view import Cell, Said, View, failures

if TYPE_CHECKING:
    from orchestrator.facts import Fact
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Result, SSHOptions, Transport

CLOCK_SAMPLES = 3


@dataclass
class NodeChecks:
    """A node's verdict of the preflight: its facts (and how it was reached) and every check's verdict."""

    inspected: InspectedNode
    checks: dict[str, Verdict]
    notes: list[str] = field(default_factory=list)  # how it was reached (no sftp subsystem, ...)

    @property
    def status(self) -> str:
        """The worst level of its checks: ok, warn or fail."""
        return worst([v.level for v in self.checks.values()]) if self.checks else "fail"

    @property
    def failed(self) -> bool:
        return self.status == "fail"

    def public_dict(self) -> dict[str, Any]:
        """A node's ``--json`` fields: its facts, how it was reached, every check's verdict."""
        return {
            **self.inspected.public_dict(),
            "transport_notes": self.notes,
            "checks": {name: v.public_dict() for name, v in self.checks.items()},
        }


@dataclass
class PreflightContext:
    """What the preflight found and decided for the whole cluster before judging each node: the
    backend, each reached node's facts and verdicts, the versions side by side, and the errors of the
    nodes it could not reach (the measurements behind the verdicts ran around the runner: see
    docs/design.md "Steps and the runner")."""

    backend: str
    backend_reason: str
    inspected: dict[str, InspectedNode]
    verdicts: dict[str, dict[str, Verdict]]
    versions: dict[str, dict[str, str | None]]
    notes: dict[str, list[str]]
    unreached: dict[str, BootstrapError]


class Preflight(Step[PreflightContext, NodeChecks]):
    """The preflight's verdicts as a step: its reads are each Linux node's facts (held: the round
    trip that carried them also carried the listener, :func:`run_preflight`), it changes nothing,
    and it judges each node from the checks; a node with a failed check fails the report."""

    name = "check"

    def __init__(self, inventory: Inventory, found: PreflightContext) -> None:
        self.inventory, self.found = inventory, found

    def reads(self, node: Node) -> list[Read]:
        return [] if node.os == "windows" else [facts_read_of(node, self.inventory)]

    def context(self, found: ClusterFacts) -> PreflightContext:
        return self.found

    def plan(self, node: Node, facts: Mapping[str, Any], context: PreflightContext) -> NodePlan:
        return NodePlan(node.name)

    def judge(
        self, node: Node, plan: NodePlan, results: list[Result] | None, context: PreflightContext
    ) -> NodeChecks:
        if node.name in context.unreached:
            raise context.unreached[node.name]
        return NodeChecks(
            context.inspected[node.name],
            context.verdicts.get(node.name, {}),
            context.notes.get(node.name, []),
        )

    def failed(self, verdict: NodeChecks) -> bool:
        return verdict.failed

    def data(self, context: PreflightContext) -> dict[str, Any]:
        return {
            "backend": context.backend,
            "backend_reason": context.backend_reason,
            "versions": context.versions,
        }


def preflight_facts(node: Node, master: Node) -> list[Fact[Any]]:
    """The facts the checks need beyond `inspect`'s, gathered in the same round trip. Native Windows
    nodes: the route to the master and the adapters, in PowerShell (facts/windows.py)."""
    if is_native_windows(node):
        return windows_network_facts(master.host)
    facts: list[Fact[Any]] = [
        MasterRoute(master.host),
        Addresses(),
        HostnameAddress(),
        DiskFree(workdir_for(node)),
    ]
    if node.interface:  # the interface check names the node's interfaces only for an override
        facts.append(Interfaces())
    if node.os != "windows":  # a WSL node becomes root with `wsl -u root`, no sudo involved
        facts.append(BecomeRoot())
    return facts


def facts_read_of(node: Node, inventory: Inventory) -> Read:
    """A Linux node's facts as the preflight reads them (`inspect`'s and its own, one read under the
    key :func:`~orchestrator.steps.node_facts.inspect_once` finds them by): what the main pipeline's
    first command asks, so the preflight, validate and launch ask nothing more."""
    python = training_python(node, inventory)
    extra = preflight_facts(node, inventory.master_node)
    return facts_read(facts_key(extra, python), [*linux_facts(python), *extra], timeout=FACTS_TIMEOUT)


def sample_clock(transport: Transport) -> ClockSample:
    """Offset of the node's wall clock from ours, corrected by half the round trip; best of a few
    (for nodes whose preflight round trips brought no usable clock line)."""
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


def _node_facts(node: Node, inspected: InspectedNode) -> PreflightFacts:
    values, errors = inspected.facts.values, inspected.facts.errors
    network = values.get("adapters")
    if isinstance(network, WindowsNetwork):  # native Windows: the same model as `ip addr`/`ip link`
        values = {**values, "addresses": network.addresses, "interfaces": network.interfaces}
    return PreflightFacts(
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
        root_access=values.get("root_access"),
        root_access_error=errors.get("root_access"),
    )


def check_interfaces(
    facts: list[PreflightFacts], master: str, *, single: bool, reached: Mapping[str, Reached] | None = None
) -> dict[str, Verdict]:
    """Interface verdicts for every node, the master first. The master's address (what every rank is
    told to dial) is the master's own (:func:`~orchestrator.steps.addresses.master_identity`: its
    inventory IP, what its name resolves to on itself, where the controller reached it (``reached``),
    or its only address), never what the workers resolve: a worker resolving the master's name
    elsewhere fails its own check, and only its own."""
    reached = reached or {}
    identity: MasterIdentity | None = None
    for f in facts:
        if f.node.name == master:
            identity = master_identity(
                f.node.host, f.route, tuple(f.addresses), reached=reached_of(reached, master)
            )
    if identity is None:  # the master did not answer: its inventory IP, or where the controller found it
        known = reached_of(reached, master)
        how = reached[master].how if known else "the master did not answer"
        identity = MasterIdentity(known, frozenset({known} if known else ()), f"{known}, {how}")
    verdicts: dict[str, Verdict] = {}
    master_address = identity.address
    for f in facts:
        if f.node.name == master:
            verdicts[master] = check_interface(
                f, single_node=single, peers_see_master_at=identity.address, master_is=identity.why
            )
            master_address = verdicts[master].data.get("master_address") or identity.address
    for f in facts:
        if f.node.name != master:
            verdicts[f.node.name] = check_interface(
                f, single_node=single, peers_see_master_at=master_address, master_is=identity.why
            )
    return verdicts


def check_plan(node: Node, transport: Transport, inventory: Inventory) -> list[str]:
    """What `check` sends to ``node`` (for --dry-run), in order: on a Linux node its one round trip
    (clock, facts, root access, workdir marker, listener, markers seen), then its connector. The
    connector's source ADDRESS and its targets' addresses are, at run time, each node's address
    toward the master (here: the inventory's hosts), and the mesh PORTs those the listeners report;
    markers and tokens differ per run."""
    master = inventory.master_node
    single = len(inventory.nodes) == 1
    names = (master.name,) if single else tuple(n.name for n in inventory.nodes)
    plan = MeshPlan(names, master.name, inventory.cluster.port, hold=FACTS_TIMEOUT + LISTEN_HOLD)
    python = interpreter_for(node)
    extra = preflight_facts(node, master)
    platform = transport.platform
    listener = plan.listener(node.name, transport, python)
    posix = platform.as_posix()
    if node.os == "windows" or posix is None:
        first = [
            facts_plan(node, transport, extra, python=training_python(node, inventory)),
            listener.command,
        ]
    else:  # the very round trip `check` sends (early.node_round), with a TOKEN for its marker
        script = read_script(platform, [facts_read_of(node, inventory)])
        first = [node_round(node, transport, script, plan, None if single else "TOKEN").script]
    peers = [n for n in inventory.nodes if n.name in names and n.name != node.name]
    targets = [f"{n.host}:PORT" for n in peers] + (
        [f"{master.host}:{plan.port}"] if node.name in names else []
    )
    args = ["connect", "ADDRESS", "2", plan.token, *targets]
    if posix is not None:  # Linux, WSL: the listener connects itself, told through its inbox
        return [*first, inbox_command(posix, "/tmp/cbt-reach-RANDOM/inbox", args)]
    return [*first, probe_command(platform, python, args)]


def gather_node_facts(
    session: Session, inventory: Inventory
) -> tuple[list[Outcome[InspectedNode]], list[PreflightFacts]]:
    """Connect and gather `inspect`'s facts plus the preflight's, one round trip per node, once per
    session: what an earlier phase of the session gathered (the preflight) is handed on."""
    inspected = _inspected(session, inventory, {})
    facts = [_node_facts(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    return inspected, facts


def _inspected(
    session: Session, inventory: Inventory, failed: Mapping[str, BootstrapError | None]
) -> GroupResult[InspectedNode]:
    """``inspect_once`` of every node of the session (``failed``: its read's error, raised as its
    outcome). A connected node whose facts the session holds is answered here: a fan-out would
    only print another "check ok" line for it; the others go through one fan-out."""
    master = inventory.master_node

    def facts_of(node: Node, transport: Transport) -> InspectedNode:
        error = failed.get(node.name)
        if error is not None:
            raise error
        extra = preflight_facts(node, master)
        return inspect_once(session, node, transport, extra, python=training_python(node, inventory))

    direct: dict[str, Outcome[InspectedNode]] = {}
    for node in session.nodes:
        key = facts_key(preflight_facts(node, master), training_python(node, inventory))
        if failed.get(node.name) is not None or not isinstance(session.recall(node.name, key), FactSet):
            continue
        try:
            transport = session.transport(node)
        except BootstrapError:  # the session was cancelled: the fan-out says so for it
            continue
        if transport.connected:
            direct[node.name] = Outcome(node.name, facts_of(node, transport), None, 0.0)
    rest = [n for n in session.nodes if n.name not in direct]
    mapped = {
        o.node: o for o in (session.map(facts_of, step="check", connect=False, nodes=rest) if rest else [])
    }
    return GroupResult(direct.get(n.name) or mapped[n.name] for n in session.nodes)


def _first_round(
    session: Session, inventory: Inventory, plan: MeshPlan | None, tokens: dict[str, str]
) -> tuple[list[Outcome[InspectedNode]], dict[str, NodeRound]]:
    """Every node's facts and, on Linux nodes, its round trip: the runner's read of its facts
    (:func:`facts_read_of`; held ones are not asked again) sent by ``early.first_round``: a clock
    sample, the facts, the workdir marker (when ``tokens`` is asked for), the listener of ``plan``,
    the markers it sees after that (``rounds``, still running). A round trip the main pipeline's first
    command began for this mesh is adopted instead. Windows nodes: their facts from both sides
    (facts/windows.py), a listener of their own later."""
    rounds: dict[str, NodeRound] = {}
    for node in session.nodes:  # the main pipeline's first command began these (early.py)
        early = take(session, node.name, plan) if plan is not None else None
        if early is not None:
            rounds[node.name], tokens[node.name] = early.round, early.token
    linux = [n for n in session.nodes if n.os != "windows" and n.name not in rounds]
    meshed = {n.name for n in linux if plan is not None and n.name in plan.names}
    send = first_round(session, plan, meshed, markers=bool(tokens))
    reads = {n.name: [facts_read_of(n, inventory)] for n in linux}
    failed = {
        o.node: o.error or (o.value.error if o.value is not None else None)
        for o in gather_reads(session, reads, step="check", send={name: send for name in reads})
    }
    for name in meshed:
        early = take(session, name, plan) if plan is not None else None
        if early is not None:
            rounds[name], tokens[name] = early.round, early.token
    return _inspected(session, inventory, failed), rounds


def _workdir_check(
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    rounds: dict[str, NodeRound],
    tokens: dict[str, str],
) -> dict[str, Verdict]:
    """The shared-workdir verdicts (shared_fs.py) from the markers the rounds wrote and listed; when
    a node's round could not carry them (a Windows node, a listener that did not end as asked: the
    listing may have come before every marker was written), the check's own two round trips."""
    listed = {}
    for node in nodes:
        node_round = rounds.get(node.name)
        listener = node_round.listener if node_round is not None else None
        mark = node_round.section(MARK) if node_round is not None else None
        marks = node_round.section(MARKS) if node_round is not None else None
        barrier = listener is not None and (listener.done in ("complete", "stopped") or listener.terminated)
        if node.name not in tokens or mark is None or marks is None or not barrier:
            return check_shared_workdirs(session, inventory, nodes)
        listed[node.name] = (mark, marks)
    if len(nodes) < 2:
        return check_shared_workdirs(session, inventory, nodes)  # says so without a round trip
    dirs = {n.name: workdir_for(n) for n in nodes}
    written: list[Outcome[dict[str, str]]] = []
    read: list[Outcome[dict[str, dict[str, str]]]] = []
    for node in nodes:
        (mark_out, mark_code), (marks_out, _) = listed[node.name]
        where = dirs[node.name]
        failed = {where: mark_out.strip() or f"exit code {mark_code}"} if mark_code != 0 else {}
        written.append(Outcome(node.name, failed, None, 0.0))
        # every node that answered is in ``read`` (workdir_verdicts pairs them): a failed write's
        # listing is not looked at, its verdict is the failure
        read.append(Outcome(node.name, {where: {} if failed else parse_listing(marks_out)}, None, 0.0))
    return workdir_verdicts(inventory, nodes, dirs, tokens, written, read)


def preflight_report(
    reach: Reach, inventory: Inventory, nodes: list[Node], *, dry_run: SSHOptions | None = None
) -> Report[Any]:
    """`bootstrap check` on ``nodes``: :func:`run_preflight` on a session reaching them. ``dry_run``
    (the SSH options the command would connect with): what it would send, in order (each node's one
    round trip: clock, facts, root access, workdir marker, reachability listener; then its
    connector), connecting to nothing."""
    if dry_run is not None:
        from orchestrator.steps.dry_run import planned_scripts

        return planned_scripts("", inventory, nodes, dry_run, lambda node, t: check_plan(node, t, inventory))
    return reach.within(nodes, "check", lambda on: run_preflight(on, inventory))


def run_preflight(session: Session, inventory: Inventory) -> Report[NodeChecks]:
    """Every check on every selected node: one :class:`NodeChecks` per reached node, the error of each
    node it could not reach; its exit code is the one rule (3: a node unreachable, 1: a check failed).
    The round trips, the reachability mesh and the clock samples run first (around the runner: see
    docs/design.md); :class:`Preflight` then judges each node."""
    master = inventory.master_node
    single = len(inventory.nodes) == 1
    cluster = inventory.cluster
    selected = [n.name for n in session.nodes]
    # who listens for whom is fixed before anyone answers: listeners start inside the first round
    # trip, or started in the main pipeline's first command already (early.py)
    meshed = (master.name,) if single else tuple(selected)
    plan = adopt(session, meshed, master.name, cluster.port) or mesh_plan(inventory, meshed)
    # the shared-workdir check's markers ride along when the listeners (its barrier) do
    tokens = {n.name: new_token() for n in session.nodes} if plan is not None and not single else {}
    inspected, rounds = _first_round(session, inventory, plan, tokens)
    facts = [_node_facts(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    reachable = [(node, o.value) for node, o in zip(session.nodes, inspected, strict=True) if o.value]
    names = {node.name for node, _ in reachable}

    verdicts: dict[str, dict[str, Verdict]] = {name: {} for name in names}
    for name, verdict in check_versions(facts, master.name, slurm=cluster.slurm is not None).items():
        verdicts[name]["versions"] = verdict
    backend, why, backend_verdicts = choose_backend(cluster, facts)
    for name, verdict in backend_verdicts.items():
        verdicts[name]["backend"] = verdict
    reached = reached_nodes(session, [master])  # where the controller found it: the master's address
    for name, verdict in check_interfaces(facts, master.name, single=single, reached=reached).items():
        verdicts[name]["interface"] = verdict
    # the main pipeline runs these as root on clusters of 2+ nodes (orchestrator/pipeline.py)
    needed_by = [
        step
        for step, managed in (("firewall", cluster.firewall.manage), ("time sync", cluster.time.manage))
        if managed and not single
    ]
    for f in facts:
        verdicts[f.node.name]["resources"] = check_resources(f)
        windows_verdict = check_windows(f, facts)
        if windows_verdict is not None:
            verdicts[f.node.name]["windows"] = windows_verdict
        root_verdict = check_root_access(f, needed_by)
        if root_verdict is not None:
            verdicts[f.node.name]["sudo"] = root_verdict

    samples: dict[str, ClockSample] = {}
    for name in names:  # each round trip's sample (one the time step forgot: that clock changed since)
        if isinstance(sample := session.recall(name, CLOCK), ClockSample):
            samples[name] = sample
    if plan is not None and master.name in names:
        # a single node too: torchrun binds the rendezvous port there, so "port busy" matters
        reach_nodes = [
            ReachNode(
                name=node.name,
                transport=session.transport(node),
                python=interpreter_for(node),
                address="127.0.0.1"
                if single
                else verdicts[node.name]["interface"].data.get("source") or node.host,
                listener=rounds[node.name].listener if node.name in rounds else None,
            )
            for node, _ in reachable
            if node.name in plan.names
        ]
        connector_clocks: dict[str, ClockSample] = {}
        from orchestrator.resources import default_inventory

        measured = check_reachability(
            reach_nodes,
            master.name,
            cluster.port,
            plan=plan,
            clocks=connector_clocks,
            from_default=inventory.source == str(default_inventory()),
        )
        for name, verdict in measured.items():
            verdicts[name]["reachability"] = verdict
        for name, sample in connector_clocks.items():
            if name not in samples or sample.rtt < samples[name].rtt:
                samples[name] = sample
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
    end_rounds(rounds)

    unsampled = [node for node, _ in reachable if node.name not in samples]
    if unsampled and master.name in names:
        for o in session.map(lambda node, t: sample_clock(t), step="clock", nodes=unsampled):
            if o.value is not None:
                samples[o.node] = o.value
    if master.name not in samples:
        why_not = (
            f"the master {master.name} is not selected or did not answer"
            if master.name not in names
            else f"`date` failed on the master {master.name}"
        )
        for name in names:
            verdicts[name]["clock"] = warn("clock", f"not measured: {why_not}", "fix that, then rerun")
    else:
        full = {name: samples.get(name) for name in names}
        for name, verdict in check_clocks(full, master.name, elastic=cluster.train.elastic).items():
            verdicts[name]["clock"] = verdict

    for name, verdict in _workdir_check(
        session, inventory, [n for n, _ in reachable], rounds, tokens
    ).items():
        verdicts[name]["workdir"] = verdict

    ordered = {name: {c: verdicts[name][c] for c in CHECKS if c in verdicts[name]} for name in names}
    found = PreflightContext(
        backend=backend,
        backend_reason=why,
        inspected={o.node: o.value for o in inspected if o.value is not None},
        verdicts=ordered,
        versions=version_table(facts),
        # how each node is reached, said once (e.g. files through the shell: no sftp subsystem)
        notes={n.name: list(session.transport(n).notes) for n in session.nodes if n.name in session.opened()},
        unreached={o.node: o.error for o in inspected if o.error is not None},
    )
    return run_step(session, Preflight(inventory, found), session.nodes)


def check_shown(
    inventory: Inventory, nodes: Sequence[Node], report: Report[Any], *, verbose: bool
) -> list[View | Said]:
    """What `check` shows of its report: the facts table and what each node's reading noted; the
    checks table (and the versions side by side when they differ); every verdict on one line under
    it, problems first with their fix (all of them with ``verbose``); what failed; the one-line
    verdict."""
    outcomes = report.outcomes
    shown: list[View | Said] = [facts_view(inventory, list(nodes), outcomes)]
    for o in outcomes:
        if o.value is not None:
            shown += [
                Said("note", f"{o.node}: recorded host key {key}")
                for key in o.value.inspected.recorded_host_keys
            ]
            shown += [Said("note", f"{o.node}: {note}") for note in o.value.notes]
            errors = o.value.inspected.facts.errors.items()
            shown += [
                Said("warn", f"node {o.node!r}: fact {fact!r} unavailable: {why}") for fact, why in errors
            ]
    if checks := {o.node: o.value.checks for o in outcomes if o.value is not None}:
        shown.append(checks_view(nodes, report.data["backend"], checks))
        if len({tuple(v.values()) for v in report.data["versions"].values()}) > 1:
            shown.append(versions_view(report.data["versions"]))
        shown.append(Said("info", f"backend: {report.data['backend_reason']}"))
        for level in ("fail", "warn", "ok") if verbose else ("fail", "warn"):
            label, style = LEVEL_STYLE[level]
            alike: dict[tuple[str, str, str | None], list[str]] = {}  # one line for the nodes it fits
            for node in nodes:
                for name, verdict in checks.get(node.name, {}).items():
                    if verdict.level == level:
                        alike.setdefault((name, verdict.reason, verdict.fix), []).append(node.name)
            for (name, reason, fix), names in alike.items():
                parts: tuple[Cell, ...] = (
                    Cell(f"{', '.join(names)} "),
                    Cell(label, style),
                    Cell(f" {name}: {reason}"),
                )
                parts += (Cell(f" -> {fix}", "dim" if level == "ok" else ""),) if fix else ()
                shown.append(Said("info", parts=parts, style="dim" if level == "ok" else ""))
    shown += failures(outcomes)
    verdict = "ready to train" if report.exit_code() == ExitCode.OK else "NOT ready to train"
    reached = sum(o.ok for o in outcomes)
    # no node checked: how many fail a check says nothing (what failed is said above)
    failing = f"{len(report.failing)} failing a check: " if reached else ""
    return [*shown, Said("info", f"{reached}/{len(outcomes)} nodes reachable, {failing}{verdict}")]
