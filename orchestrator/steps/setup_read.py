"""The main pipeline's first round trip on each Linux node: what its setup phases read, asked once.

Before anything changes, the pipeline must know that every selected node can become root: the
firewall and time steps run as root and never type a password (steps/preflight/privilege.py). The
same command carries what those steps read before they decide anything:

- as the login user: a clock sample (first, dated by its arrival: steps/preflight/rounds.py), the
  ``root_access`` fact, and for the time step the node's route to the master (the master: also its
  own addresses); on the nodes the pipeline checks, every fact the preflight reads (``check``'s own
  list: the route and addresses among them), so a node's facts are gathered once per pipeline (a
  step that changes the node's Python or torch, the environment sync, makes the session forget them);
- the code sync's scan of the node's code directory, read-only (it creates nothing and writes no
  cache: steps/codesync/sync.py), when the pipeline syncs code;
- then as root, in the same command (``sudo -n`` for other users, which fails at once where the
  verdict above says it will): the firewall detection (steps/firewall/linux_detection.py; without
  its route, addresses and interfaces where the facts above have them) and the chrony probe
  (steps/timesync/chrony/probe.py), framed with a second token;
- last, on the nodes the pipeline checks, what the preflight's round trip carries after the facts:
  the workdir marker, then the reachability listener, which keeps the command running until the
  preflight's connectors reached it (steps/preflight/early.py). The preflight then sends only its
  connectors.

Each answer is handed to its step through the session, under the key that step reads it by
(``Session.seed``; :data:`~orchestrator.steps.firewall.DETECTION`,
:data:`~orchestrator.steps.timesync.apply.PROBE`, :data:`~orchestrator.steps.timesync.master.ROUTE`,
:data:`~orchestrator.steps.preflight.CLOCK`, :data:`~orchestrator.steps.codesync.sync.SCAN`). A step
that changes a node forgets what it changed there; so with nothing to change, the sync, firewall and
time phases send no command of their own to read. An answer that did not come (sudo refused, a
section cut short) is not handed on: that step then asks itself and reports the failure as its
standalone command does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError
from orchestrator.facts.base import Fact, FactSet, split_sections
from orchestrator.facts.linux import BecomeRoot, RootAccess, linux_facts
from orchestrator.platforms import PosixShell
from orchestrator.records import new_nonce

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.steps.codesync import LocalTree
    from orchestrator.steps.preflight.reachability import MeshPlan
    from orchestrator.transports import Transport

__all__ = ["read_setup"]

#: the section of the round trip that runs as root (its own sections inside, framed with another token)
AS_ROOT = "as_root"
#: the section that scans the code directory (code sync's own script, creating nothing)
CODE = "code_scan"


def read_setup(
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    *,
    code: Sequence[str] = (),
    checked: Sequence[str] = (),
) -> dict[str, RootAccess | BootstrapError]:
    """One round trip per Linux node of ``nodes``: each node's ``root_access`` verdict (or why there is
    none; for :func:`~orchestrator.steps.preflight.privilege.refused_root`), with the firewall and time
    steps' first reads handed to them through ``session`` (see the module docstring); on the nodes
    named in ``code`` also the code sync's scan, read-only (it creates nothing); on those named in
    ``checked`` the preflight's facts, remembered for it."""
    from orchestrator.steps.preflight.early import mesh_plan

    linux = [n for n in nodes if n.os == "linux"]
    tree = None
    if code:
        from orchestrator.steps.codesync import prepare_tree

        try:
            tree = prepare_tree(inventory)
        except BootstrapError:  # the sync step says what is wrong with the project, in its place
            tree = None
    scanned = set(code) if tree is not None else set()
    # the preflight's mesh: each checked node's listener starts at the end of this round trip
    # (steps/preflight/early.py), as it would at the end of the preflight's own
    plan = mesh_plan(inventory, tuple(checked)) if len(checked) > 1 else None

    def one(node: Node, transport: Transport) -> RootAccess:
        start = time.monotonic()
        transport.connect()
        # on a checked node: how long connecting took (the preflight's facts report it)
        connected = time.monotonic() - start if node.name in checked else None
        mesh = plan if node.name in checked else None
        scan = tree if node.name in scanned else None
        return _read(session, inventory, node, transport, scan, connected, mesh)

    found: dict[str, RootAccess | BootstrapError] = {}
    for o in session.map(one, step="read setup", nodes=linux, connect=False):
        if o.error is not None:
            found[o.node] = o.error
        elif o.value is not None:
            found[o.node] = o.value
    return found


def _read(
    session: Session,
    inventory: Inventory,
    node: Node,
    transport: Transport,
    tree: LocalTree | None,
    connected: float | None,
    plan: MeshPlan | None,
) -> RootAccess:
    from orchestrator.steps.codesync.sync import SCAN, code_dest, parse_probe_output, probe_command, scan_args
    from orchestrator.steps.firewall import DETECTION
    from orchestrator.steps.firewall.linux_detection import detect, detection_sections
    from orchestrator.steps.firewall.rules import ClusterTag
    from orchestrator.steps.node_facts import InspectedNode, facts_key, interpreter_for, training_python
    from orchestrator.steps.preflight import CLOCK, preflight_facts
    from orchestrator.steps.preflight.early import EARLY, EarlyRound
    from orchestrator.steps.preflight.rounds import NodeRound
    from orchestrator.steps.timesync.apply import PROBE
    from orchestrator.steps.timesync.chrony import parse_probe, probe_script
    from orchestrator.steps.timesync.master import ROUTE, route_facts

    platform = transport.platform
    if not isinstance(platform, PosixShell):
        raise BootstrapError(f"a Linux node that speaks {platform.name}, not a POSIX shell", node=node.name)
    cluster, master = inventory.cluster, inventory.master_node
    ids = ClusterTag(cluster.name)
    route = route_facts(node, master.host, master.name) if cluster.time.manage else []
    wanted: list[Fact[Any]] = [BecomeRoot(), *route]
    check_python, check_extra = training_python(node, inventory), preflight_facts(node, master)
    if connected is not None:  # the preflight's facts (root access, route, addresses among them), once
        wanted = [*linux_facts(check_python), *check_extra]
    network = {"route", "addresses", "interfaces"}.issubset(f.name for f in wanted)
    root: list[tuple[str, str]] = []
    inner = new_nonce()  # frames the root sections, and the detection's answers inside them
    if cluster.firewall.manage:
        root += detection_sections(
            platform, master_host=master.host, ids=ids, nonce=inner, network=not network
        )
    if cluster.time.manage:
        root.append(("chrony", probe_script(platform)))
    before = [(AS_ROOT, platform.wrap(platform.sectioned(root, inner), become=True))] if root else []
    if tree is not None:  # as the login user, creating nothing: the sync step scans for real if needed
        dest = code_dest(cluster, node)
        before.append(
            (CODE, probe_command(node, platform, scan_args(tree, dest, windows=False, dry_run=True)))
        )
    if plan is not None:  # the preflight's marker, listener and markers seen (early.py)
        from orchestrator.runs.layout import workdir_for
        from orchestrator.steps.preflight.rounds import MARK, MARKS, list_command, mark_command
        from orchestrator.steps.preflight.shared_fs import MARKER_DIR, new_token

        token, workdir = new_token(), workdir_for(node)
        listener = plan.listener(node.name, transport, interpreter_for(node))
        before.append((MARK, mark_command(platform, workdir, MARKER_DIR, node.name, token)))
        after = [(MARKS, list_command(platform, workdir, MARKER_DIR))]
        done = NodeRound(node.name, transport, wanted, listener, before=before, after=after).start()
        session.seed(node.name, EARLY, EarlyRound(plan, token, done))
    else:
        done = NodeRound(node.name, transport, wanted, before=before).run()
    facts = done.gathered()  # raises what the transport raised: the node is unreachable
    access = facts.get("root_access")
    if not isinstance(access, RootAccess):
        why = facts.errors.get("root_access", "no answer")
        raise BootstrapError(f"could not tell whether commands can become root: {why}", node=node.name)
    clock = done.clock()
    if clock is not None:
        session.seed(node.name, CLOCK, clock)
    if route:
        names = [f.name for f in route]
        session.seed(
            node.name,
            ROUTE,
            FactSet(
                {k: v for k, v in facts.values.items() if k in names},
                {k: v for k, v in facts.errors.items() if k in names},
            ),
        )
    text = (done.section(AS_ROOT) or ("", 1))[0]
    sections = split_sections(text, inner)
    if cluster.firewall.manage and "range" in sections:
        detection = detect(text, inner, ids)
        if network:  # the firewall step's view of the node's network: the facts' (the same commands)
            detection = replace(
                detection,
                route=facts.get("route"),
                addresses=facts.get("addresses") or (),
                interfaces=facts.get("interfaces") or (),
            )
        session.seed(node.name, DETECTION, detection)
    if connected is not None:
        session.seed(
            node.name,
            facts_key(check_extra, check_python),
            InspectedNode(
                via=transport.describe(),
                facts=facts,
                connect_seconds=connected,
                recorded_host_keys=list(transport.recorded_host_keys),
            ),
        )
    probe: Any = sections.get("chrony")
    if cluster.time.manage and probe is not None and probe[1] == 0:
        try:
            session.seed(node.name, PROBE, parse_probe(probe[0]))
        except ValueError:  # not what the probe prints: the time step asks again and says so
            pass
    scan = done.section(CODE) if tree is not None else None
    found = parse_probe_output(scan[0]) if scan is not None and scan[1] == 0 else None
    if found is not None:
        session.seed(node.name, SCAN, found)
    return access
