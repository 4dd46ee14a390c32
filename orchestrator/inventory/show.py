"""The inventory as `bootstrap inventory` shows it: a row per node (no connection made)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.inventory.cluster import Inventory
from orchestrator.inventory.model import Node
from orchestrator.runs.layout import workdir_for
from orchestrator.view import View


def windows_mode(node: Node) -> str:
    """``wsl:Ubuntu-22.04``, ``wsl`` (the user's default distribution) or ``native``."""
    if node.windows.mode == "native":
        return "native"
    return f"wsl:{node.windows.distro}" if node.windows.distro else "wsl"


def inventory_view(inventory: Inventory, nodes: Sequence[Node]) -> View:
    """Each node: how it is reached, as whom, its OS (Windows: its mode), GPUs, ranks, its workdir
    with ``{node}`` replaced (where its runs, code and venv go), its tags; the master marked."""
    columns = ("node", "connection", "address", "user", "os", "gpus", "nproc", "workdir", "tags")
    view = View(
        f"cluster {inventory.cluster.name} ({inventory.format} inventory {inventory.source})", columns
    )
    for node in nodes:
        view.add(
            node.name + (" (master)" if node.name == inventory.cluster.master else ""),
            node.connection,
            node.address,
            node.user or "-",
            node.os if node.os != "windows" else f"windows ({windows_mode(node)})",
            str(node.gpus),
            str(node.nproc),
            workdir_for(node),
            ",".join(node.tags),
        )
    return view
