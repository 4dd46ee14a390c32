"""`bootstrap clean`: remove what bootstrap put on the nodes (environments, shipped code, run
directories), each found by bootstrap's own marker, never by a name alone: a file someone else put
in the workdir stays (docs/cli.md).

One node-side script (``probes/clean_node.py``) lists, measures and (``remove``) deletes; it refuses
on a node where a run of this workdir is still running. :func:`clean_node` runs it on one node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.errors import CommandFailedError, ExitCode, UsageError
from orchestrator.executor import GroupResult, Outcome, exit_code_for
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.runs.layout import workdir_for
from orchestrator.steps.codesync.sync import code_dest
from orchestrator.steps.envsync.spec import env_path

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport


@dataclass
class CleanItem:
    kind: str  # env | code | runs
    path: str
    bytes: int
    files: int


@dataclass
class NodeClean:
    """What bootstrap left on a node (``removed``: and it is gone now)."""

    node: str
    items: list[CleanItem] = field(default_factory=list)
    running: list[str] = field(default_factory=list)
    removed: bool = False
    errors: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def public_dict(self) -> dict[str, Any]:
        return {
            "items": [i.__dict__ for i in self.items],
            "bytes": self.bytes,
            "running": self.running,
            "removed": self.removed,
            "errors": self.errors,
        }


def script() -> str:
    """The node-side script, with the record encoder it writes its answer with."""
    text = resources.files("orchestrator.steps.probes").joinpath("clean_node.py").read_text()
    return "import base64\n" + records.PYTHON_ENCODER + "\n" + text


def clean_args(
    node: Node, inventory: Inventory, *, remove: bool, nonce: str, outputs: bool = False
) -> dict[str, Any]:
    return {
        "nonce": nonce,
        "node": node.name,
        "workdir": workdir_for(node),
        "env": env_path(node, path_setting=inventory.cluster.env.path),
        "code": code_dest(inventory.cluster, node),
        "remove": remove,
        "outputs": outputs,  # each run's $CB_RUN_DIR (checkpoints): kept unless asked
    }


def clean_node(
    node: Node, transport: Transport, inventory: Inventory, *, remove: bool, outputs: bool = False
) -> NodeClean:
    """List (and with ``remove`` delete) what bootstrap put on ``node``; one round trip."""
    if node.python_os == "windows":
        raise UsageError(
            "clean is not supported on native Windows nodes yet", node=node.name, hint="nothing was removed"
        )
    nonce = records.new_nonce()
    args = clean_args(node, inventory, remove=remove, nonce=nonce, outputs=outputs)
    argv = [interpreter_for(node), "-c", script(), json.dumps(args)]
    result = transport.run(transport.platform.join(argv), timeout=600)
    answer = records.find(result.stdout, nonce, "clean")
    if not result.ok or answer is None:
        tail = " | ".join(result.tail(3)) or f"exit code {result.exit_code}"
        raise CommandFailedError(f"clean failed: {tail}", node=node.name, result=result)
    data = json.loads(answer.text(0))
    return NodeClean(
        node=node.name,
        items=[CleanItem(**item) for item in data.get("items") or []],
        running=list(data.get("running") or []),
        removed=bool(data.get("removed")),
        errors=list(data.get("errors") or []),
    )


@dataclass
class CleanReport:
    """What `clean` found (``removed`` False) or removed on every node."""

    outcomes: GroupResult[NodeClean]
    removed: bool

    @property
    def busy(self) -> list[Outcome[NodeClean]]:
        """Nodes where a run is running: nothing is removed on any node."""
        return [o for o in self.outcomes if o.value is not None and o.value.running]

    @property
    def bytes(self) -> int:
        return sum(o.value.bytes for o in self.outcomes if o.value is not None)

    def final(self) -> bool:
        """Nothing to remove, or removal refused: a node could not be read, one runs a run, or
        nothing of bootstrap's is there (no question to ask)."""
        failed = any(o.error is not None for o in self.outcomes)
        return bool(self.busy) or failed or not any(o.value and o.value.items for o in self.outcomes)

    def exit_code(self) -> ExitCode:
        """1 also when a run blocked the removal, or a node kept something it should have lost."""
        code = exit_code_for(self.outcomes)
        kept = any(o.value is not None and (o.value.errors or o.value.running) for o in self.outcomes)
        return (
            ExitCode.NODES_FAILED if code == ExitCode.OK and (self.busy or (self.removed and kept)) else code
        )


def clean_all(session: Session, inventory: Inventory, *, remove: bool, outputs: bool) -> CleanReport:
    """``clean_node`` on every node of ``session``: a listing, or (``remove``) the removal."""
    return CleanReport(
        session.map(
            lambda n, t: clean_node(n, t, inventory, remove=remove, outputs=outputs),
            step="clean" if remove else "clean (read)",
        ),
        removed=remove,
    )
