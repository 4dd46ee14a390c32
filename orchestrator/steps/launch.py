"""Plan and start training on every node: render, upload, run, stream `[node:rank]` lines back.

Every node gets its rendered script in ``<workdir>/runs/<run-id>/<node>/launch.sh`` and keeps its
output in ``node.log`` beside it; the controller keeps its own copy (``runs/<run-id>/<node>.log``).
A node that fails stops the others (fail fast: the session closes their connections, which stops
each remote process group; see PosixShell.stop_on_hangup).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import CancelledError, CommandFailedError, UsageError
from orchestrator.platforms import PosixShell
from orchestrator.render import DEFAULT_WORKDIR, LaunchSpec, Renderer, plan_launch
from orchestrator.resources import packaged_example
from orchestrator.steps.inspect import interpreter_for
from orchestrator.steps.preflight import check_interfaces, gather_node_facts
from orchestrator.steps.preflight.checks import choose_backend

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.steps.inspect import NodeFacts
    from orchestrator.transports import Transport

#: torchrun --tee 3 prefixes each worker line with its local rank
_RANK_LINE = re.compile(r"^\[default(\d+)\]:(.*)$")
TAIL = 20


@dataclass
class LaunchPlan:
    specs: list[LaunchSpec]
    backend: str
    backend_reason: str
    inspected: list[Outcome[NodeFacts]]
    warnings: list[str]


def plan(session: Session, inventory: Inventory, run_id: str) -> LaunchPlan:
    """Facts from every node (route to the master, CPUs), then one LaunchSpec per node."""
    master = inventory.master_node
    inspected, facts = gather_node_facts(session, inventory)
    single = len(inventory.nodes) == 1
    verdicts = check_interfaces(facts, master.name, single=single)
    warnings = [f"node {n!r}: {v.reason} ({v.fix})" for n, v in verdicts.items() if v.level == "fail"]
    interfaces = {n: (v.data.get("gloo_socket_ifname"), v.data.get("source")) for n, v in verdicts.items()}
    master_verdict = verdicts.get(master.name)
    master_addr = (
        "127.0.0.1" if single else master_verdict.data.get("master_address") if master_verdict else None
    )
    cpus = {
        o.node: o.value.facts.get("cpus")
        for o in inspected
        if o.value is not None and isinstance(o.value.facts.get("cpus"), int)
    }
    backend, why, _ = choose_backend(inventory.cluster, facts)
    specs = plan_launch(
        inventory,
        backend=backend,
        master_addr=master_addr or master.host,
        run_id=run_id,
        interfaces=interfaces,
        cpus=cpus,
        pythons={n.name: interpreter_for(n) for n in inventory.nodes},
    )
    return LaunchPlan(specs, backend, why, inspected, warnings)


def local_script(script: str) -> Path | None:
    """The training script to upload: the controller's file (relative to the current directory), or
    the shipped example when the inventory keeps the default and no such file is here."""
    here = Path(script)
    if here.is_file():
        return here
    if script == "examples/train_ddp.py":
        return packaged_example()
    return None


@dataclass
class NodeRunResult:
    exit_code: int
    duration: float
    tail: list[str]
    node_log: str


def run_dir_for(node: Node, run_id: str) -> str:
    """The node's directory for one run (launch script, node.log, pid and exit-code files).

    Per node even on the node: homes shared over NFS (common in labs) would otherwise make every node
    run the last-written script.
    """
    workdir = node.workdir or DEFAULT_WORKDIR
    return f"{workdir.rstrip('/')}/runs/{run_id}/{node.name}"


def run_node(
    node: Node,
    transport: Transport,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    on_line: Callable[[str, str], None],
    template: str | None = None,
    script_file: Path | None = None,
) -> NodeRunResult:
    """Upload and run one node's launch script; raises CommandFailedError (with the tail) on failure.

    ``template``: another launch template than the platform's default (validation uses one);
    ``script_file``: a local file uploaded to ``spec.script`` (an absolute path on the node) instead
    of the training script.
    """
    platform = transport.platform
    if not isinstance(platform, PosixShell):
        raise UsageError(f"launching on {platform.name} nodes is not supported yet", node=node.name)
    run_dir = run_dir_for(node, spec.run_id)
    # A relative script is this project's: uploaded into the code directory (full code sync comes
    # with `bootstrap sync`). An absolute one is taken to be on the node already.
    absolute = spec.script.startswith("/")
    source = script_file if script_file is not None else None if absolute else local_script(spec.script)
    target_script = spec.script if absolute else f"{spec.code_dir.rstrip('/')}/{spec.script}"
    prepare = transport.run(
        platform.mkdir(run_dir)
        + "\n"
        + platform.mkdir(spec.code_dir + ("" if absolute else "/" + str(Path(spec.script).parent))),
        timeout=60,
    )
    if not prepare.ok:
        raise CommandFailedError(f"cannot create {run_dir}: {' | '.join(prepare.tail(3))}", node=node.name)
    with tempfile.TemporaryDirectory(prefix="cb-launch-") as tmp:
        launch_file = Path(tmp) / "launch.sh"
        launch_file.write_text(renderer.render(spec, platform, template=template))
        transport.put(launch_file, f"{run_dir}/launch.sh", mode=0o700)
    if source is not None:
        transport.put(source, target_script)
    node_log = f"{run_dir}/node.log"
    command = platform.logged(platform.run_script(f"{run_dir}/launch.sh"), node_log)
    result = transport.run(command, on_line=lambda stream, line: on_line(node.name, line), keep_lines=200)
    if result.exit_code is None:
        # our own connection was closed: another node failed (fail fast) or the user interrupted
        raise CancelledError("stopped", node=node.name, hint=f"its log: {node_log}")
    if result.exit_code != 0:
        error = CommandFailedError(
            f"training exited with code {result.exit_code}"
            if result.exit_code is not None
            else "training was stopped",
            node=node.name,
            hint=f"the node keeps its log in {node_log}",
            result=result,
        )
        raise error
    return NodeRunResult(0, result.duration, result.tail(TAIL), node_log)


def split_rank(line: str) -> tuple[int | None, str]:
    """``[default3]:text`` -> (3, "text"); torchrun's own lines have no rank."""
    match = _RANK_LINE.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), match.group(2)
