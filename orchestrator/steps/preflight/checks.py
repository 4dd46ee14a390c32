"""The preflight's decisions, from facts already gathered: pure functions, no I/O.

Each check returns one Verdict per node (see model.py). Sources of the rules: ../shared/FIELD_NOTES.md
(versions are never compared by torch itself; gloo's TCP vs UV transports; the 127.0.1.1 trap; the
elastic rendezvous' wall-clock heartbeats).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UsageError
from orchestrator.facts.linux import GpuReport, PythonInfo, RootAccess, TorchInfo
from orchestrator.facts.network import DiskSpace, InterfaceAddress, Route
from orchestrator.facts.windows import WindowsInfo, wsl_blocker
from orchestrator.facts.wsl import WslInfo
from orchestrator.steps.envsync import master as _master_env  # the fixes name its sync
from orchestrator.steps.preflight.model import Verdict, fail, ok, warn

if TYPE_CHECKING:
    from orchestrator.inventory import Cluster, Inventory, Node

#: clock offset above which a warning is given (seconds)
CLOCK_WARN = 1.0
#: c10d dynamic rendezvous expels a node whose heartbeat is older than keep_alive 5 s x 3 attempts
#: (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py; pytorch#76287)
ELASTIC_CLOCK_LIMIT = 15.0
DISK_WARN = 5 * 2**30
DISK_FAIL = 1 * 2**30


@dataclass(frozen=True)
class PreflightFacts:
    """What the checks need from one node (None: that fact is unknown)."""

    node: Node
    python: PythonInfo | None
    torch: TorchInfo | None
    gpus: GpuReport | None
    route: Route | None
    addresses: tuple[InterfaceAddress, ...]
    interfaces: tuple[str, ...]
    hostname: str | None
    hostname_address: str | None
    disk: DiskSpace | None
    torch_error: str | None = None  # the torch probe itself failed (not: torch missing)
    python_error: str | None = None
    windows: WindowsInfo | None = None  # Windows nodes: the Windows build
    wsl: WslInfo | None = None  # Windows nodes: WSL as the Windows side sees it
    down: tuple[str, ...] = ()  # interfaces that exist but are not up (native Windows: adapters)
    root_access: RootAccess | None = None  # Linux nodes: can commands become root without a password
    root_access_error: str | None = None  # why that is unknown


# -- versions --------------------------------------------------------------------------------------


def _versions_of(f: PreflightFacts) -> dict[str, str | None]:
    torch = f.torch.version if f.torch and f.torch.installed else None
    return {
        "python": f.python.version if f.python else None,
        "torch": torch,
        "cuda": (f.torch.cuda_build or "cpu") if torch and f.torch else None,
    }


def check_versions(
    facts: Sequence[PreflightFacts], master: str, *, slurm: bool = False
) -> dict[str, Verdict]:
    """Identical torch (and CUDA build) and Python on every rank; gloo really usable on each.
    ``slurm``: the nodes are a Slurm allocation's (the fixes name what sets their interpreter)."""
    table = {f.node.name: _versions_of(f) for f in facts}
    reference = table.get(master) or next(iter(table.values()), {})
    verdicts: dict[str, Verdict] = {}
    for f in facts:
        mine = table[f.node.name]
        data: dict[str, Any] = {"versions": mine, "master": reference}
        py = f.node.python or "python3"
        if f.python is None and f.python_error:
            verdicts[f.node.name] = fail(
                "versions",
                f"{py} fails: {f.python_error}",
                "run it on the node to see why, or set python: to a working interpreter",
                **data,
            )
            continue
        if f.python is None:
            verdicts[f.node.name] = fail(
                "versions",
                f"{py} not found",
                "install Python 3 or set python: to the interpreter's path for this node (with "
                "cluster.env, training runs <workdir>/venv/bin/python: `bootstrap sync` builds it)",
                **data,
            )
            continue
        if f.torch_error:
            verdicts[f.node.name] = fail(
                "versions",
                f"the torch probe failed with {f.python.path}: {f.torch_error}",
                "run `python -c 'import torch'` on this node with that interpreter to see why",
                **data,
            )
            continue
        if f.torch is None or not f.torch.installed:
            verdicts[f.node.name] = fail(
                "versions",
                f"torch is not installed for {f.python.path}",
                _master_env.torch_missing_fix(reference.get("torch"), slurm=slurm),
                **data,
            )
            continue
        if f.torch.error:
            verdicts[f.node.name] = fail(
                "versions",
                f"torch is broken here: {f.torch.error}",
                "reinstall torch for this interpreter",
                **data,
            )
            continue
        differences = []
        label_note = ""
        if f.node.name != master:
            base, _, label = (mine["torch"] or "").partition("+")
            ref_base, _, ref_label = (reference.get("torch") or "").partition("+")
            if base != ref_base:
                differences.append(f"torch {mine['torch']} here, {reference.get('torch')} on the master")
            elif label != ref_label:
                # 2.13.0+cpu on a CPU node beside 2.13.0+cu126 on a GPU node: same release, different
                # build; gloo between them works, but two CUDA builds must match for NCCL ranks
                if f.node.gpus > 0 and mine["cuda"] != "cpu" and reference.get("cuda") not in (None, "cpu"):
                    differences.append(
                        f"torch {mine['torch']} here, {reference.get('torch')} on the master "
                        "(CUDA builds differ)"
                    )
                else:
                    label_note = f" (build {label or 'default'} here, {ref_label or 'default'} on the master)"
            pymine, pyref = (mine["python"] or "").split("."), (reference.get("python") or "").split(".")
            if pymine[:2] != pyref[:2]:
                differences.append(f"Python {mine['python']} here, {reference.get('python')} on the master")
        if differences:
            verdicts[f.node.name] = fail(
                "versions",
                "; ".join(differences),
                _master_env.versions_differ_fix(mine, reference, slurm=slurm),
                **data,
            )
            continue
        if not f.torch.gloo_works:
            why = f.torch.gloo_error or "torch.distributed has no gloo backend"
            verdicts[f.node.name] = fail(
                "versions",
                f"gloo does not work in this torch: {why}",
                "install a torch build whose gloo works here (Windows wheels 2.8-2.10 lack the gloo "
                "device: use 2.7 or 2.11+, or WSL mode)",
                **data,
            )
            continue
        if label_note:
            verdicts[f.node.name] = warn(
                "versions",
                f"torch {mine['torch']}: same release as the master{label_note}",
                "fine for gloo between CPU and GPU ranks; use identical builds where ranks share NCCL",
                **data,
            )
            continue
        if f.node.name != master and mine["python"] != reference.get("python"):
            verdicts[f.node.name] = warn(
                "versions",
                f"Python {mine['python']} here, {reference.get('python')} on the master",
                "object collectives pickle Python objects: identical Python versions are safest",
                **data,
            )
            continue
        verdicts[f.node.name] = ok(
            "versions", f"torch {mine['torch']}, Python {mine['python']}: same as the master", **data
        )
    return verdicts


def version_table(facts: Sequence[PreflightFacts]) -> dict[str, dict[str, str | None]]:
    return {f.node.name: _versions_of(f) for f in facts}


# -- backend ---------------------------------------------------------------------------------------


def _nccl_blocker(f: PreflightFacts) -> str | None:
    """Why this node cannot run NCCL ranks (None: it can)."""
    if is_native_windows(f.node):
        return "native Windows torch has no NCCL"
    if f.torch is None or not f.torch.installed:
        return "no torch"
    if not f.torch.nccl:
        return "this torch build has no NCCL"
    if not f.torch.cuda_available or f.torch.cuda_devices == 0:
        return "no CUDA GPU visible to torch"
    if f.node.gpus == 0:
        return "gpus: 0 in the inventory (CPU ranks)"
    return None


def choose_backend(cluster: Cluster, facts: Sequence[PreflightFacts]) -> tuple[str, str, dict[str, Verdict]]:
    """(backend, why, verdicts). ``auto`` picks nccl only when every rank can run it, else gloo."""
    blockers = {f.node.name: _nccl_blocker(f) for f in facts}
    linux = [f.node.name for f in facts if not is_native_windows(f.node)]  # Linux torch (WSL too)
    windows = [f.node.name for f in facts if f.node.os == "windows"]
    verdicts: dict[str, Verdict] = {}
    if cluster.backend == "auto":
        blocked = {n: why for n, why in blockers.items() if why}
        if blocked:
            first = next(iter(blocked))
            backend, why = "gloo", f"auto: gloo, since {first} cannot run NCCL ({blocked[first]})"
        else:
            backend, why = "nccl", "auto: nccl, every rank has a CUDA GPU and NCCL on Linux"
    else:
        backend, why = cluster.backend, f"{cluster.backend}, as the inventory says"
    for f in facts:
        name = f.node.name
        if is_native_windows(f.node) and linux:
            # check_windows says why and what to do; the backend cannot form such a group either
            verdicts[name] = fail(
                "backend",
                f"native Windows ranks cannot join Linux ranks ({', '.join(linux[:3])}) in one gloo group",
                "set windows: {mode: wsl} for this node (the windows check says why)",
                backend=backend,
            )
        elif backend == "nccl" and blockers[name]:
            verdicts[name] = fail(
                "backend",
                f"backend nccl, but {blockers[name]}",
                "set backend: auto or gloo in the inventory, or give this node a CUDA GPU and a CUDA torch",
                backend=backend,
            )
        else:
            verdicts[name] = ok("backend", why, backend=backend, windows=windows)
    return backend, why, verdicts


# -- interface -------------------------------------------------------------------------------------


def _interface_holding(address: str | None, addresses: Sequence[InterfaceAddress]) -> str | None:
    return next((a.interface for a in addresses if a.address == address), None)


def _address_of(interface: str, addresses: Sequence[InterfaceAddress]) -> str | None:
    return next((a.address for a in addresses if a.interface == interface), None)


def _hosts_file(f: PreflightFacts) -> str:
    return "C:\\Windows\\System32\\drivers\\etc\\hosts" if is_native_windows(f.node) else "/etc/hosts"


def _route_command(f: PreflightFacts, address: str) -> str:
    if is_native_windows(f.node):
        return f"`Find-NetRoute -RemoteIPAddress {address}`"
    return f"`ip -4 route get {address}`"


def check_interface(
    f: PreflightFacts,
    *,
    single_node: bool = False,
    peers_see_master_at: str | None = None,
    master_is: str = "",
) -> Verdict:
    """The interface and source address that route to the master: GLOO_SOCKET_IFNAME later.

    ``peers_see_master_at``: the master's address, every rank's rendezvous (established from the
    master's side: ``master_is`` says how, for messages). On the master itself that is what counts:
    its own name may resolve to 127.0.1.1 there (the Debian trap) while peers reach it through DNS.
    A node resolving the master's name to another address fails, naming what it resolved.

    Native Windows nodes give the same facts (facts/windows.py): the interface is the adapter's
    friendly name, which is what gloo matches there; ``down`` lists adapters that are not up, which
    gloo cannot find.
    """
    route = f.route
    if single_node and f.node.interface is None:
        # one machine: every rank is local, loopback is the right (and fastest) path
        return ok("interface", "single node: ranks meet over loopback", interface="lo", source="127.0.0.1")
    if route is None:
        tools = "Find-NetRoute works" if is_native_windows(f.node) else "iproute2 (`ip`) and getent exist"
        return fail(
            "interface",
            "the route to the master could not be read (the facts command failed here)",
            f"check that {tools} on this node; rerun with -v",
        )
    if route.address is None:
        why = f" ({route.detail})" if route.detail else ""
        known = (
            f" (this machine reaches it at {peers_see_master_at}: {route.target} may be an ~/.ssh/config "
            "alias, which only this machine knows)"
            if peers_see_master_at and peers_see_master_at != route.target
            else ""
        )
        return fail(
            "interface",
            f"cannot resolve the master's address {route.target} on this node{why}",
            f"use the master's IP address as its host:{known}, or add it to {_hosts_file(f)} on this node",
        )
    interface, source = route.interface, route.source
    master_address = route.address
    own = {a.address for a in f.addresses}
    if (
        peers_see_master_at
        and (route.local or route.address.startswith("127."))
        and peers_see_master_at in own
    ):
        # this is the master: the address the peers dial is the one that matters
        master_address = peers_see_master_at
        interface, source = _interface_holding(peers_see_master_at, f.addresses), peers_see_master_at
    elif route.local or interface == "lo":
        # this node holds the master's address itself: use the interface that carries it
        interface = _interface_holding(route.address, f.addresses) or interface
        source = route.address
    data: dict[str, Any] = {"interface": interface, "source": source, "master_address": master_address}
    if interface is None or source is None:
        why = f" ({route.detail})" if route.detail else ""
        return fail(
            "interface",
            f"no route from this node to the master's address {route.address}{why}",
            f"check this node's network configuration ({_route_command(f, route.address)} must name "
            "an interface)",
            **data,
        )
    holds_it = route.local and peers_see_master_at in own  # the master itself
    if peers_see_master_at and route.address != peers_see_master_at and not holds_it:
        return fail(
            "interface",
            f"this node resolves the master {route.target} to {route.address}, but the master is "
            f"{master_is or peers_see_master_at}: its route, and so its interface for the ranks, would be "
            "chosen toward another machine",
            f"fix {route.target} in this node's {_hosts_file(f)} or DNS, or use the master's IP as its host:",
            **data,
        )
    if f.node.interface:
        data["override"] = f.node.interface
        if f.node.interface not in f.interfaces:
            loopback = {a.interface for a in f.addresses if a.address.startswith("127.")}
            have = ", ".join(
                repr(i) + (" (not up)" if i in f.down else "")
                for i in f.interfaces
                if i not in loopback | {"lo"}
            )
            spelled = [i for i in f.interfaces if i.lower() == f.node.interface.lower()]
            fix = (
                f"write it as {spelled[0]!r}: gloo compares names exactly, case included"
                if spelled
                else f"set interface: to one of them (the route to the master uses {interface!r}) "
                "or remove it"
            )
            return fail(
                "interface",
                f"interface {f.node.interface!r} (inventory) does not exist here; "
                f"interfaces: {have or 'none'}",
                fix,
                **data,
            )
        if f.node.interface in f.down:
            return fail(
                "interface",
                f"interface {f.node.interface!r} (inventory) is not up here: gloo cannot use it",
                f"connect or enable it, or set interface: to one that is up (the route to the master uses "
                f"{interface!r}) or remove it",
                **data,
            )
        override_address = _address_of(f.node.interface, f.addresses)
        if override_address is None:
            return fail(
                "interface",
                f"interface {f.node.interface} (inventory) has no IPv4 address",
                "give it an address or choose another interface",
                **data,
            )
        data["gloo_socket_ifname"] = f.node.interface
        data["source"] = override_address  # the reachability probes use the override's network
        if f.node.interface != interface:
            return warn(
                "interface",
                f"interface {f.node.interface} ({override_address}, inventory) but the master is routed "
                f"through {interface}",
                "make sure the master and every peer are reachable on that network (reachability tests it)",
                **data,
            )
        interface, source = f.node.interface, override_address
    data["gloo_socket_ifname"] = interface
    if interface == "lo" or master_address.startswith("127."):
        return fail(
            "interface",
            f"the master address {master_address} is a loopback address",
            "give the master a LAN address (or name) in the inventory, not localhost",
            **data,
        )
    if f.hostname_address and f.hostname_address.startswith("127."):
        return warn(
            "interface",
            f"{interface} ({source}); hostname {f.hostname} resolves to {f.hostname_address}: without "
            "GLOO_SOCKET_IFNAME, gloo would bind loopback and peers would hang",
            f"set GLOO_SOCKET_IFNAME={interface} for training (bootstrap's launch will), or map "
            f"{f.hostname} to {source} in /etc/hosts",
            **data,
        )
    return ok("interface", f"{interface} ({source}) routes to the master", **data)


# -- clock -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClockSample:
    offset: float  # node clock minus controller clock, seconds
    rtt: float  # round trip of the best sample: the offset is known to +- rtt/2


def check_clocks(
    samples: Mapping[str, ClockSample | None], master: str, *, elastic: bool = False
) -> dict[str, Verdict]:
    """Offsets from the master's clock. Static rendezvous does not care (steady clocks); elastic
    (c10d dynamic) rendezvous compares wall-clock heartbeats and expels a node beyond ~15 s."""
    reference = samples.get(master)
    verdicts: dict[str, Verdict] = {}
    for name, sample in samples.items():
        if sample is None or reference is None:
            verdicts[name] = warn("clock", "not measured", "rerun when the node (and master) answer")
            continue
        offset = sample.offset - reference.offset
        error = (sample.rtt + reference.rtt) / 2
        data = {"offset_s": round(offset, 4), "uncertainty_s": round(error, 4)}
        text = f"{offset:+.3f} s from the master (+-{error:.3f} s)"
        if abs(offset) - error > ELASTIC_CLOCK_LIMIT and elastic:
            verdicts[name] = fail(
                "clock",
                f"{text}: elastic rendezvous would expel this node (heartbeats older than "
                f"{ELASTIC_CLOCK_LIMIT:g} s)",
                "sync clocks (chrony or systemd-timesyncd on every node) "
                "or widen --rdzv-conf keep_alive_interval",
                **data,
            )
        elif abs(offset) - error > CLOCK_WARN:
            verdicts[name] = warn(
                "clock",
                text,
                "sync clocks (chrony or systemd-timesyncd on every node); static rendezvous tolerates it, "
                "logs will not line up",
                **data,
            )
        else:
            verdicts[name] = ok("clock", text, **data)
    return verdicts


# -- resources -------------------------------------------------------------------------------------


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_resources(f: PreflightFacts) -> Verdict:
    node = f.node
    visible = len(f.gpus.gpus) if f.gpus else 0
    data: dict[str, Any] = {"gpus_asked": node.gpus, "nproc": node.nproc, "gpus_visible": visible}
    problems: list[tuple[str, str]] = []  # (reason, fix)
    notes: list[str] = []
    if f.gpus and f.gpus.error:
        problems.append((f"nvidia-smi fails: {f.gpus.error}", "fix the NVIDIA driver on this node"))
    if node.gpus > 0:
        if visible < node.gpus:
            problems.append(
                (
                    f"the inventory asks for {node.gpus} GPU(s), nvidia-smi shows {visible}",
                    "set gpus: to what the node has, or fix its driver",
                )
            )
        torch_devices = f.torch.cuda_devices if f.torch and f.torch.installed else 0
        if f.torch and f.torch.installed and torch_devices < node.nproc:
            problems.append(
                (
                    f"{node.nproc} rank(s) need a GPU each, torch sees {torch_devices}",
                    "install a CUDA build of torch matching the driver, or check CUDA_VISIBLE_DEVICES",
                )
            )
    elif visible:
        notes.append(f"{visible} GPU(s) present but gpus: 0 (CPU ranks)")
    if f.disk is not None:
        data["disk_free_bytes"] = f.disk.free_bytes
        data["disk_path"] = f.disk.path
        if f.disk.free_bytes < DISK_FAIL:
            problems.append((f"only {_gib(f.disk.free_bytes)} free in {f.disk.path}", "free some disk space"))
    if problems:
        return fail("resources", "; ".join(r for r, _ in problems), "; ".join(x for _, x in problems), **data)
    if f.disk is not None and f.disk.free_bytes < DISK_WARN:
        return warn(
            "resources",
            f"{_gib(f.disk.free_bytes)} free in {f.disk.path}",
            "environments and checkpoints need room: free some disk space",
            **data,
        )
    text = f"{node.nproc} rank(s), {visible} GPU(s) visible"
    if f.disk is not None:
        text += f", {_gib(f.disk.free_bytes)} free"
    if notes:
        text += "; " + "; ".join(notes)
    return ok("resources", text, **data)


# -- windows ---------------------------------------------------------------------------------------


def is_native_windows(node: Node) -> bool:
    """Ranks of this node run Windows torch (not the Linux build inside WSL)."""
    return node.os == "windows" and node.windows.mode == "native"


def _names_of(nodes: Sequence[Node]) -> str:
    return ", ".join(n.name for n in nodes)


def native_mix_error(inventory: Inventory) -> UsageError | None:
    """Why this inventory's training job cannot run, when it mixes native Windows nodes with Linux
    or WSL-mode ones; None when it does not.

    Decided from the inventory alone, never from which nodes were selected (``--nodes``) or
    answered: a training job spans every node, so a native node selected alone, or one whose Linux
    peers are down, is the same mistake. Windows wheels of torch have only gloo's UV (libuv)
    transport, Linux wheels (inside WSL too) only its TCP transport, and the two handshakes differ
    (FIELD_NOTES; pytorch/gloo#386): such a job hangs or fails at its first connection. A
    configuration error (exit 2): refused before anything connects, is uploaded or starts.
    """
    native = [n for n in inventory.nodes if is_native_windows(n)]
    linux = [n for n in inventory.nodes if n.os != "windows"]
    wsl = [n for n in inventory.nodes if n.os == "windows" and not is_native_windows(n)]
    if not native or not (linux or wsl):
        return None
    groups = [f"{_names_of(linux)} (Linux)"] if linux else []
    groups += [f"{_names_of(wsl)} (Windows in WSL mode)"] if wsl else []
    natives = _names_of(native)
    one = len(native) == 1
    what, its = ("native Windows node", "its") if one else ("native Windows nodes", "their")
    return UsageError(
        f"{inventory.source}: {what} {natives} (windows.mode: native) cannot train with "
        f"{' and '.join(groups)}: Windows builds of torch have only gloo's UV (libuv) transport, Linux "
        "builds (WSL included) only its TCP transport, and ranks of the two cannot form one gloo "
        "process group (pytorch/gloo#386); nothing was started",
        hint=f"set windows: {{mode: wsl}} for {natives}, so that {its} ranks run the Linux build of torch "
        "inside WSL2 with mirrored networking, see docs/windows.md; or make every node of the cluster "
        "native Windows",
    )


def refuse_native_mix(inventory: Inventory) -> None:
    """Raise :func:`native_mix_error`'s error, if any (``check``, ``validate``, ``launch`` and the
    main pipeline call this before connecting to anything)."""
    error = native_mix_error(inventory)
    if error is not None:
        raise error


def check_windows(f: PreflightFacts, facts: Sequence[PreflightFacts]) -> Verdict | None:
    """Can this Windows node's ranks join the others? None for Linux nodes.

    Native mode beside Linux or WSL ranks fails: Windows wheels have only gloo's UV (libuv) transport,
    Linux wheels only its TCP transport, and their handshakes differ (FIELD_NOTES; pytorch/gloo#386).
    (The CLI refuses such an inventory before connecting, from the inventory itself:
    :func:`native_mix_error`; this verdict is what a direct caller of the preflight gets.)
    WSL mode fails when WSL cannot run the distribution, and warns when WSL's networking is not
    mirrored: in NAT mode peers cannot reach the ephemeral ports gloo listens on in the distribution.
    """
    node = f.node
    if node.os != "windows":
        return None
    if node.windows.mode == "native":
        others = [g.node.name for g in facts if g.node.name != node.name and not is_native_windows(g.node)]
        if others:
            return fail(
                "windows",
                f"native Windows ranks cannot be in one gloo group with Linux or WSL ranks "
                f"({', '.join(others[:3])}): Windows torch has only gloo's UV (libuv) transport, Linux "
                "torch only its TCP transport, and they do not understand each other (pytorch/gloo#386)",
                "set windows: {mode: wsl} for this node (training then runs the Linux build of torch in "
                "WSL2 with mirrored networking), or make every node native Windows",
                mode="native",
                others=others,
            )
        return ok(
            "windows",
            "native Windows: every rank runs Windows torch (gloo only; one process per rank, no torchrun)",
            mode="native",
        )
    distro = node.windows.distro
    if f.wsl is None:
        return warn(
            "windows",
            "WSL state unknown (the Windows-side facts are missing)",
            "check that WSL2 works for this user: `wsl --status` and `wsl --list --verbose`",
            mode="wsl",
        )
    blocker = wsl_blocker(f.wsl, f.windows, distro)
    if blocker is None:
        mode = f.wsl.networking_mode
        return ok("windows", "WSL2 with mirrored networking", mode="wsl", networking_mode=mode)
    if wsl_blocker(replace(f.wsl, networking_mode="mirrored"), f.windows, distro) is None:
        return warn(
            "windows",
            blocker.split("; set ")[0] if "; set " in blocker else blocker,
            "set networkingMode=mirrored under [wsl2] in %UserProfile%\\.wslconfig (Windows 11 22H2+), "
            "then `wsl --shutdown`",
            mode="wsl",
            networking_mode=f.wsl.networking_mode,
        )
    return fail("windows", blocker, "fix WSL on this machine, then rerun", mode="wsl")
