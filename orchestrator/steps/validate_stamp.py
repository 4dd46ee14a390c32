"""When the main pipeline may leave out validation: nothing it depends on changed since the last
successful validation on the same nodes.

The key is a digest of what decides whether every rank can join and all_reduce: the node set and each
node's address, ranks, interpreter, interface and launch environment (the launch plan validation runs),
the master's address and port, the backend chosen and asked for, the firewall settings, and each
node's facts about its system and torch (versions, build, GPUs). The controller keeps one stamp per
node set of an inventory in its state directory (owner-only, like run records); a successful
validation writes it, and an equal key later lets the pipeline say so in one line instead.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.facts.linux import public_value
from orchestrator.logs import state_dir
from orchestrator.safefiles import private_dirs, write_inside

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.steps.launch import LaunchPlan

#: node facts that decide whether ranks can join and reduce (not clocks, memory or load)
FACTS = ("os", "kernel", "python", "torch", "gpus")


@dataclass
class Stamp:
    key: str
    when: float  # time.time() of the validation


def stamp_key(inventory: Inventory, launch_plan: LaunchPlan) -> str:
    """The digest of what validation depends on (see the module docstring)."""
    facts = {
        o.node: {name: public_value(o.value.facts.get(name)) for name in FACTS}
        for o in launch_plan.inspected
        if o.value is not None
    }
    cluster = inventory.cluster
    doc: dict[str, Any] = {
        "nodes": [
            {
                "name": s.node.name,
                "host": s.node.host,
                "port": s.node.port,
                "user": s.node.user,
                "node_rank": s.node_rank,
                "nproc": s.nproc,
                "python": s.python,
                "local_addr": s.local_addr,
                "env": dict(sorted(s.env.items())),
                "facts": facts.get(s.node.name),
            }
            for s in launch_plan.specs
        ],
        "master": [s.master_addr for s in launch_plan.specs[:1]],
        "port": cluster.port,
        "backend": [launch_plan.backend, cluster.backend],
        "firewall": cluster.firewall.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def stamp_file(inventory: Inventory) -> Path:
    """One file per inventory (its path and cluster name) under the controller's state directory."""
    source = str(Path(inventory.source).resolve())
    name = hashlib.sha256(f"{source}\0{inventory.cluster.name}".encode()).hexdigest()[:24]
    return state_dir() / "validated" / f"{name}.json"


def _node_set(inventory: Inventory) -> str:
    return ",".join(sorted(n.name for n in inventory.nodes))


def last_stamp(inventory: Inventory) -> Stamp | None:
    """The stamp of the last successful validation on these nodes (None: none, or unreadable)."""
    try:
        doc = json.loads(stamp_file(inventory).read_text())
        entry = doc[_node_set(inventory)]
        return Stamp(str(entry["key"]), float(entry["when"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_stamp(inventory: Inventory, key: str) -> None:
    """Remember a successful validation on these nodes (0600, in an owner-only directory)."""
    path = stamp_file(inventory)
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            doc = {}
    except (OSError, ValueError):
        doc = {}
    doc[_node_set(inventory)] = {"key": key, "when": time.time()}
    private_dirs(path.parent)
    write_inside(path.parent, path.name, (json.dumps(doc, indent=2) + "\n").encode(), mode=0o600)


def unchanged_since(
    inventory: Inventory, launch_plan: LaunchPlan, *, reuse: bool
) -> tuple[str | None, Stamp | None]:
    """This plan's stamp key (None when a node could not be read: nothing to compare or save) and,
    when ``reuse`` (the main pipeline without ``--validate``), the last success's stamp if nothing
    validation depends on changed since (validation is then skipped)."""
    key = stamp_key(inventory, launch_plan) if all(o.ok for o in launch_plan.inspected) else None
    last = last_stamp(inventory) if reuse and key is not None else None
    return key, last if last is not None and last.key == key else None
