"""Connect and learn what each node is: the facts behind `bootstrap facts`, `check`, validate and launch.

Within one session the facts of a node are gathered once (``Session.remember``): the main pipeline's
preflight hands them to validate and launch. A step that changes a node (``sync``) makes the session
forget them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.facts import CONNECTED, SESSION_KEY_PREFIX, Fact, FactSet, gather, linux_facts, public_value
from orchestrator.facts.base import fact_sections
from orchestrator.facts.interpreter import DEFAULT_PYTHON, interpreter_for
from orchestrator.facts.windows import gather_windows_side, windows_facts, windows_modes
from orchestrator.platforms import Platform
from orchestrator.records import new_nonce
from orchestrator.steps.envsync import venv_python
from orchestrator.transports import Transport
from orchestrator.view import Cell, CellLike, View, red

if TYPE_CHECKING:
    from orchestrator.executor import GroupResult, Outcome
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session

__all__ = [
    "DEFAULT_PYTHON",
    "InspectedNode",
    "facts_key",
    "facts_plan",
    "inspect",
    "inspect_once",
    "interpreter_for",
    "training_python",
]


def training_python(node: Node, inventory: Inventory) -> str:
    """The interpreter training (and the preflight's torch checks) use: the synced venv's when the
    inventory declares an environment (cluster.env: `bootstrap sync` made it), else the node's own."""
    from orchestrator.steps.envsync.master import synced_from_master

    if inventory.cluster.env.declared or synced_from_master(node, inventory):  # `sync --from-master`
        return venv_python(node, inventory)
    return interpreter_for(node)


@dataclass
class InspectedNode:
    """A node's facts plus how we reached it."""

    via: str
    facts: FactSet
    connect_seconds: float
    recorded_host_keys: list[str] = field(default_factory=list)

    def public_dict(self) -> dict[str, Any]:
        return {
            "via": self.via,
            "connect_seconds": round(self.connect_seconds, 4),
            "recorded_host_keys": self.recorded_host_keys,
            "facts": {k: public_value(v) for k, v in self.facts.values.items()},
            "fact_errors": self.facts.errors,
        }

    def row(self, python_name: str) -> tuple[CellLike, ...]:
        """The facts table's cells after the node's name: ok, how it was reached, hostname, OS (and
        the Windows under WSL, or the modes it offers), CPUs, memory, Python (``python_name`` not
        found: in yellow), torch (its CUDA build and distributed backends), GPUs."""
        facts = self.facts
        os_info, kernel = facts.get("os"), facts.get("kernel")
        python, torch, gpus = facts.get("python"), facts.get("torch"), facts.get("gpus")
        os_text = (os_info.pretty_name if os_info else "?") + (f" ({kernel.machine})" if kernel else "")
        windows, modes = facts.get("windows"), facts.get("modes")
        if windows is not None:  # native: Windows itself; WSL mode: the distribution on it
            build = f"{windows.build}" + (f".{windows.ubr}" if windows.ubr is not None else "")
            shown = f"{windows.caption} (build {build})"
            os_text = f"{os_text} in WSL on {shown}" if os_info else shown
        if modes is not None:
            os_text += "; modes: " + (", ".join(modes.modes) or "none")
        torch_text = "-"
        if torch is not None and not torch.installed:
            torch_text = "not installed"
        elif torch is not None and torch.error:
            torch_text = f"broken: {torch.error}"
        elif torch is not None:
            backends = ", ".join(b for b in ("gloo", "nccl") if getattr(torch, b)) or "no distributed"
            cuda = f" cuda {torch.cuda_build}" if torch.cuda_build else ""
            torch_text = f"{torch.version}{cuda} ({backends})"
        gpu_text = "-"
        if gpus is not None and gpus.error:
            gpu_text = f"nvidia-smi failed: {gpus.error}"
        elif gpus is not None:
            gpu_text = (
                f"{len(gpus.gpus)}x " + ", ".join(sorted({g.name for g in gpus.gpus}))
                if gpus.gpus
                else "none"
            )
        memory = facts.get("memory")
        return (
            Cell("ok", "green"),
            self.via,
            str(facts.get("hostname") or "?"),
            os_text,
            str(facts.get("cpus") or "?"),
            f"{memory.total_bytes / 2**30:.1f} GiB" if memory and memory.total_bytes else "-",
            Cell(f"{python_name} not found", "yellow") if python is None else python.version,
            torch_text,
            gpu_text,
        )

    def summary(self) -> dict[str, str]:
        """The facts the page shows per node, each as a short text (OS, CPUs, memory, GPUs, torch,
        interface to the master, how it was reached)."""
        values: dict[str, Any] = {}
        for name, value in self.facts.values.items():
            try:
                values[name] = public_value(value)
            except TypeError:
                values[name] = str(value)
        out: dict[str, str] = {"via": self.via}
        system = values.get("os") or values.get("windows")
        if isinstance(system, dict):
            out["os"] = str(system.get("pretty_name") or system.get("caption") or system.get("id") or "")
        cpus = values.get("cpus")
        if cpus is not None:
            out["cpus"] = str(cpus.get("count", cpus) if isinstance(cpus, dict) else cpus)
        memory = values.get("memory")
        if isinstance(memory, dict) and isinstance(memory.get("total_bytes"), int):
            out["memory"] = f"{memory['total_bytes'] / 2**30:.1f} GiB"
        gpus = values.get("gpus")
        if isinstance(gpus, dict):
            found = gpus.get("gpus") or []
            out["gpus"] = (
                ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in found) or "none"
            )
        torch = values.get("torch")
        if isinstance(torch, dict):
            out["torch"] = str(
                torch.get("version") or ("not installed" if not torch.get("installed") else "")
            )
        route = values.get("route")
        if isinstance(route, dict) and route.get("interface"):
            out["interface"] = f"{route['interface']} ({route.get('source') or '?'})"
        return {k: v for k, v in out.items() if v}


def _windows_plan(
    node: Node, platform: Platform, extra: Sequence[Fact[Any]], python: str | None = None
) -> tuple[list[Fact[Any]], list[Fact[Any]], list[str]]:
    """(Windows-side facts, facts for the node's own platform, names of facts not gathered).

    Native mode: the Windows facts and ``extra`` (the preflight gives native nodes PowerShell
    facts: the route to the master, the adapters) in one PowerShell round trip.
    WSL mode: Windows and WSL facts from the Windows side (one PowerShell round trip), the Linux
    facts and ``extra`` inside the distribution (a second one, see ``gather_windows_side``)."""
    if platform.in_wsl:
        return windows_facts(None, mode="wsl"), [*linux_facts(python or interpreter_for(node)), *extra], []
    return [], [*windows_facts(python or node.python), *extra], []


def _is_windows(node: Node, transport: Transport) -> bool:
    platform = transport.platform
    return node.os == "windows" and (platform.as_powershell() is not None or platform.in_wsl)


def facts_plan(
    node: Node, transport: Transport, extra: Sequence[Fact[Any]] = (), *, python: str | None = None
) -> str:
    """The exact script `facts`/`check` run on the node (for --dry-run); its records' nonce is
    chosen anew for each run, as here."""
    platform = transport.platform
    nonce = new_nonce()
    if _is_windows(node, transport):
        windows, own, _ = _windows_plan(node, platform, extra, python)
        script = platform.wrap(platform.sectioned(fact_sections(own, platform), nonce))
        if platform.in_wsl:
            ps = platform.host_shell
            windows_side = ps.wrap(ps.sectioned(fact_sections(windows, ps), nonce))
            return f"{windows_side}\n# then, inside the WSL distribution:\n{script}"
        return script
    facts = [*linux_facts(python or interpreter_for(node)), *extra]
    return platform.wrap(platform.sectioned(fact_sections(facts, platform), nonce))


def _gather_windows(
    node: Node, transport: Transport, extra: Sequence[Fact[Any]], python: str | None
) -> FactSet:
    platform = transport.platform
    windows, own, skipped = _windows_plan(node, platform, extra, python)
    facts = gather(transport, own)
    if windows and transport.reaches_windows_host:
        side = gather_windows_side(transport, windows)
        facts.values.update(side.values)
        facts.errors.update(side.errors)
    else:
        for fact in windows:
            facts.errors[fact.name] = f"the {transport.kind} transport cannot run PowerShell beside WSL"
    for name in skipped:
        facts.errors[name] = "not gathered on native Windows nodes yet"
    facts.values["modes"] = windows_modes(facts.values, node.windows.distro, wsl_node=platform.in_wsl)
    return facts


def inspect_all(session: Session) -> GroupResult[InspectedNode]:
    """`facts`: :func:`inspect` on every node of ``session`` (each connects when its turn comes)."""
    return session.map(inspect, step="facts", connect=False)


def inspect(
    node: Node,
    transport: Transport,
    extra: Sequence[Fact[Any]] = (),
    *,
    python: str | None = None,
) -> InspectedNode:
    """Connect, then gather the standard facts plus ``extra`` ones in the same round trip.
    ``python``: the interpreter whose Python and torch are reported (default: the node's own)."""
    start = time.monotonic()
    transport.connect()
    connected = time.monotonic() - start
    if _is_windows(node, transport):
        facts = _gather_windows(node, transport, extra, python)
    else:
        facts = gather(transport, [*linux_facts(python or interpreter_for(node)), *extra])
    return InspectedNode(
        via=transport.describe(),
        facts=facts,
        connect_seconds=connected,
        recorded_host_keys=list(transport.recorded_host_keys),
    )


def facts_key(extra: Sequence[Fact[Any]], python: str | None) -> str:
    """The session memo's key for one set of facts (the inventory, hence each fact's arguments, is
    fixed for a session)."""
    return SESSION_KEY_PREFIX + (python or "-") + " " + ",".join(f.name for f in extra)


def inspect_once(
    session: Session,
    node: Node,
    transport: Transport,
    extra: Sequence[Fact[Any]] = (),
    *,
    python: str | None = None,
) -> InspectedNode:
    """:func:`inspect`, once per session and node: the first phase that asks gathers, later phases
    get the same answer (a failure is not remembered). Facts the runner read under the same key (the
    main pipeline's first command: steps/preflight ``facts_read_of``) are taken as they are, with how
    the node was reached. Connects in any case."""
    held = session.recall(node.name, facts_key(extra, python))
    if isinstance(held, FactSet):
        transport.connect()  # connected already by the read (idempotent)
        return InspectedNode(
            via=transport.describe(),
            facts=held,
            connect_seconds=float(session.recall(node.name, CONNECTED) or 0.0),  # type: ignore[arg-type]
            recorded_host_keys=list(transport.recorded_host_keys),
        )
    found = session.remember(
        node.name, facts_key(extra, python), lambda: inspect(node, transport, extra, python=python)
    )
    transport.connect()  # remembered: this phase still needs the connection (idempotent)
    return found


def facts_view(inventory: Inventory, nodes: Sequence[Node], outcomes: Sequence[Outcome[Any]]) -> View:
    """The nodes' facts, a row each (``outcomes``: of `facts`, InspectedNode; of `check`, its
    verdict, whose ``inspected`` they are); the master marked; a node not reached in red."""
    columns = ("node", "status", "via", "hostname", "os", "cpus", "memory", "python", "torch", "gpus")
    view = View(f"cluster {inventory.cluster.name}: {len(nodes)} node(s)", columns, fold=True)
    for node, o in zip(nodes, outcomes, strict=True):
        name = node.name + (" (master)" if node.name == inventory.cluster.master else "")
        if o.value is None:
            view.add(name, red(o.error.status if o.error else "failed"), *["-"] * 8)
        else:
            seen = o.value if isinstance(o.value, InspectedNode) else o.value.inspected
            view.add(name, *seen.row(node.python or DEFAULT_PYTHON))
    return view
