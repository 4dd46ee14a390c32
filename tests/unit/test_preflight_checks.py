"""The preflight's decisions from facts (pure): versions, backend, interface, clock, resources, sudo."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.facts.linux import GpuInfo, GpuReport, PythonInfo, RootAccess, TorchInfo
from orchestrator.facts.network import DiskSpace, InterfaceAddress, Route
from orchestrator.facts.windows import WindowsInfo
from orchestrator.facts.windows_network import WindowsRoute
from orchestrator.facts.wsl import WslDistro, WslInfo
from orchestrator.inventory import Cluster, Node
from orchestrator.inventory.model import WindowsSettings
from orchestrator.steps.preflight.checks import (
    ClockSample,
    PreflightFacts,
    check_clocks,
    check_interface,
    check_resources,
    check_versions,
    check_windows,
    choose_backend,
    native_mix_error,
)
from orchestrator.steps.preflight.privilege import check_root_access

CPU_TORCH = TorchInfo(installed=True, version="2.13.0+cpu", distributed=True, gloo=True, gloo_works=True)
CUDA_TORCH = replace(
    CPU_TORCH, version="2.13.0+cu126", cuda_build="12.6", cuda_available=True, cuda_devices=2, nccl=True
)
GPU = GpuInfo(index=0, name="NVIDIA GeForce RTX 3090", memory_mib=24576, driver="550.54.14", uuid="GPU-1")


def facts(name: str, **over: Any) -> PreflightFacts:
    windows_info = over.pop("windows_info", None)  # PreflightFacts.windows (``windows=`` is the node's field)
    node_fields = {k: over.pop(k) for k in ("gpus", "nproc", "interface", "os", "windows") if k in over}
    if windows_info is not None:
        over["windows"] = windows_info
    base = PreflightFacts(
        node=Node(name=name, host=f"10.0.0.{len(name)}", **node_fields),
        python=PythonInfo(path="/usr/bin/python3", version="3.11.2"),
        torch=CPU_TORCH,
        gpus=GpuReport(gpus=(), nvidia_smi=False),
        route=Route("10.0.0.1", "10.0.0.1", "eth0", "10.0.0.2", False),
        addresses=(InterfaceAddress("lo", "127.0.0.1", 8), InterfaceAddress("eth0", "10.0.0.2", 24)),
        interfaces=("lo", "eth0"),
        hostname=name,
        hostname_address="10.0.0.2",
        disk=DiskSpace("/home/u", 50 * 2**30),
    )
    return replace(base, **over)


def test_same_versions_everywhere_is_ok() -> None:
    verdicts = check_versions([facts("m"), facts("w")], "m")
    assert {v.level for v in verdicts.values()} == {"ok"}
    assert "torch 2.13.0+cpu, Python 3.11.2" in verdicts["w"].reason


def test_version_differences_fail_with_both_sides_named() -> None:
    other = replace(CPU_TORCH, version="2.7.0+cpu")
    verdicts = check_versions(
        [facts("m"), facts("w", torch=other, python=PythonInfo("/usr/bin/python3", "3.10.12"))], "m"
    )
    w = verdicts["w"]
    assert w.level == "fail"
    assert "torch 2.7.0+cpu here, 2.13.0+cpu on the master" in w.reason
    assert "Python 3.10.12 here, 3.11.2 on the master" in w.reason
    assert verdicts["m"].level == "ok"


def test_python_micro_difference_is_a_warning() -> None:
    verdicts = check_versions([facts("m"), facts("w", python=PythonInfo("/usr/bin/python3", "3.11.9"))], "m")
    assert verdicts["w"].level == "warn" and "object collectives" in (verdicts["w"].fix or "")


def test_missing_python_torch_or_working_gloo() -> None:
    broken_gloo = replace(CPU_TORCH, gloo_works=False, gloo_error="RuntimeError: unsupported gloo device")
    verdicts = check_versions(
        [
            facts("m"),
            facts("nopy", python=None, torch=None),
            facts("notorch", torch=TorchInfo(installed=False)),
            facts("nogloo", torch=broken_gloo),
        ],
        "m",
    )
    assert verdicts["nopy"].level == "fail" and "not found" in verdicts["nopy"].reason
    assert verdicts["notorch"].level == "fail" and "2.13.0+cpu" in (verdicts["notorch"].fix or "")
    assert verdicts["nogloo"].level == "fail" and "unsupported gloo device" in verdicts["nogloo"].reason


def test_auto_backend_is_nccl_only_when_every_rank_can() -> None:
    cluster = Cluster(name="c", master="m")
    all_gpu = [facts("m", torch=CUDA_TORCH, gpus=2), facts("w", torch=CUDA_TORCH, gpus=2)]
    backend, why, verdicts = choose_backend(cluster, all_gpu)
    assert backend == "nccl" and {v.level for v in verdicts.values()} == {"ok"}
    backend, why, verdicts = choose_backend(cluster, [*all_gpu, facts("cpu")])
    assert backend == "gloo" and "cpu cannot run NCCL" in why


def test_forced_nccl_fails_where_it_cannot_run() -> None:
    backend, _, verdicts = choose_backend(Cluster(name="c", master="m", backend="nccl"), [facts("m")])
    assert (
        backend == "nccl"
        and verdicts["m"].level == "fail"
        and "backend: auto or gloo" in (verdicts["m"].fix or "")
    )


def test_native_windows_with_linux_fails_naming_the_cause() -> None:
    win = facts("win", os="windows", windows=WindowsSettings(mode="native"))
    _, _, verdicts = choose_backend(Cluster(name="c", master="m"), [facts("m"), win])
    assert verdicts["win"].level == "fail"
    assert "gloo group" in verdicts["win"].reason and "mode: wsl" in (verdicts["win"].fix or "")
    assert verdicts["m"].level == "ok"
    # in WSL mode (the default) the node runs Linux torch: no conflict
    _, _, verdicts = choose_backend(Cluster(name="c", master="m"), [facts("m"), facts("wsl", os="windows")])
    assert verdicts["wsl"].level == "ok"


def test_interface_from_the_route_to_the_master() -> None:
    verdict = check_interface(facts("w"))
    assert verdict.level == "ok" and verdict.data["gloo_socket_ifname"] == "eth0"
    assert verdict.data["source"] == "10.0.0.2"


def test_master_uses_the_interface_holding_its_address() -> None:
    route = Route("10.0.0.2", "10.0.0.2", "lo", "10.0.0.2", True)
    verdict = check_interface(facts("m", route=route))
    assert verdict.level == "ok" and verdict.data["interface"] == "eth0"


def test_interface_problems() -> None:
    assert check_interface(facts("w", interface="eth9")).level == "fail"
    mismatch = check_interface(facts("w", interface="lo"))
    assert mismatch.level == "warn"
    loop = check_interface(facts("w", hostname_address="127.0.1.1"))
    assert loop.level == "warn" and "GLOO_SOCKET_IFNAME=eth0" in (loop.fix or "")
    unresolved = check_interface(facts("w", route=Route("master.lan", None, None, None, False)))
    assert unresolved.level == "fail" and "master.lan" in unresolved.reason
    assert check_interface(facts("solo", route=None), single_node=True).level == "ok"


def test_clock_offsets_relative_to_the_master() -> None:
    samples = {
        "m": ClockSample(offset=100.0, rtt=0.01),
        "ok": ClockSample(offset=100.2, rtt=0.01),
        "skewed": ClockSample(offset=130.0, rtt=0.01),
        "lost": None,
    }
    verdicts = check_clocks(samples, "m")
    assert verdicts["ok"].level == "ok" and verdicts["skewed"].level == "warn"
    assert abs(verdicts["skewed"].data["offset_s"] - 30.0) < 1e-6
    assert verdicts["lost"].level == "warn"
    assert check_clocks(samples, "m", elastic=True)["skewed"].level == "fail"


def test_resources() -> None:
    one_gpu = GpuReport(gpus=(GPU,), nvidia_smi=True)
    asks_two = check_resources(replace(facts("w", gpus=2, torch=CUDA_TORCH), gpus=one_gpu))
    assert asks_two.level == "fail" and "asks for 2 GPU(s), nvidia-smi shows 1" in asks_two.reason
    fine = check_resources(replace(facts("w", gpus=1, nproc=1, torch=CUDA_TORCH), gpus=one_gpu))
    assert fine.level == "ok"
    spare = check_resources(replace(facts("w"), gpus=one_gpu))
    assert spare.level == "ok" and "gpus: 0 (CPU ranks)" in spare.reason
    low = check_resources(facts("w", disk=DiskSpace("/", 2 * 2**30)))
    assert low.level == "warn"
    full = check_resources(facts("w", disk=DiskSpace("/", 100 * 2**20)))
    assert full.level == "fail" and "free" in full.reason


def test_master_whose_name_resolves_to_loopback_on_itself() -> None:
    # Debian's 127.0.1.1 line on the master; the peers reach it at 10.0.0.2 through DNS
    route = Route("node1", "127.0.1.1", "lo", "127.0.0.1", True)
    verdict = check_interface(facts("m", route=route), peers_see_master_at="10.0.0.2")
    assert verdict.level == "ok" and verdict.data["interface"] == "eth0"
    assert verdict.data["master_address"] == "10.0.0.2"


def test_a_node_resolving_the_master_elsewhere_fails() -> None:
    stale = Route("node1", "10.0.0.99", "eth0", "10.0.0.2", False)
    verdict = check_interface(facts("w", route=stale), peers_see_master_at="10.0.0.1")
    assert verdict.level == "fail" and "10.0.0.99" in verdict.reason and "10.0.0.1" in verdict.reason


def test_no_route_or_no_facts_is_not_ok() -> None:
    no_route = check_interface(facts("w", route=Route("m", "10.9.9.9", None, None, False)))
    assert no_route.level == "fail" and "no route" in no_route.reason
    assert check_interface(facts("w", route=None)).level == "fail"


def test_interface_override_uses_its_own_address() -> None:
    f = facts(
        "w",
        interface="ib0",
        interfaces=("lo", "eth0", "ib0"),
        addresses=(InterfaceAddress("eth0", "10.0.0.2", 24), InterfaceAddress("ib0", "10.1.0.2", 24)),
    )
    verdict = check_interface(f)
    assert verdict.level == "warn" and verdict.data["source"] == "10.1.0.2"
    assert verdict.data["gloo_socket_ifname"] == "ib0"


def test_same_release_different_build_warns_for_cpu_beside_gpu() -> None:
    verdicts = check_versions([facts("m", torch=CUDA_TORCH, gpus=2), facts("cpu")], "m")
    assert verdicts["cpu"].level == "warn" and "same release" in verdicts["cpu"].reason
    other_cuda = replace(CUDA_TORCH, version="2.13.0+cu118", cuda_build="11.8")
    verdicts = check_versions(
        [facts("m", torch=CUDA_TORCH, gpus=2), facts("g", torch=other_cuda, gpus=2)], "m"
    )
    assert verdicts["g"].level == "fail" and "CUDA builds differ" in verdicts["g"].reason


def test_a_failed_probe_is_not_reported_as_missing_torch() -> None:
    verdicts = check_versions([facts("m"), facts("w", torch=None, torch_error="timed out")], "m")
    assert verdicts["w"].level == "fail" and "probe failed" in verdicts["w"].reason


# -- windows (modes) -------------------------------------------------------------------------------

WIN11 = WindowsInfo("Microsoft Windows 11 Pro", "10.0.22631", 22631, 2861, "23H2", "64-bit")
UBUNTU = WslDistro("Ubuntu-22.04", "Running", 2, True)
MIRRORED = WslInfo(installed=True, version="2.0.9.0", distros=(UBUNTU,), networking_mode="mirrored")
NATIVE = WindowsSettings(mode="native")


def test_native_windows_beside_linux_or_wsl_fails_with_why_and_fix() -> None:
    native = facts("win", os="windows", windows=NATIVE, windows_info=None)
    for other in (facts("m"), facts("w2", os="windows", windows_info=WIN11, wsl=MIRRORED)):
        verdict = check_windows(native, [other, native])
        assert verdict is not None and verdict.level == "fail"
        assert "UV (libuv) transport" in verdict.reason and "TCP transport" in verdict.reason
        assert other.node.name in verdict.reason
        assert "mode: wsl" in (verdict.fix or "")
    assert check_windows(facts("m"), [facts("m"), native]) is None  # Linux nodes: not this check's business


def test_an_all_native_windows_cluster_is_fine() -> None:
    a = facts("a", os="windows", windows=NATIVE)
    b = facts("b", os="windows", windows=NATIVE)
    verdict = check_windows(a, [a, b])
    assert verdict is not None and verdict.level == "ok" and "no torchrun" in verdict.reason


def _inventory(*nodes: str) -> Any:
    from orchestrator.inventory import load_inventory_text

    """An inventory of nodes given as "NAME" (Linux) or "NAME MODE" (Windows in that mode)."""
    text = f"cluster: {{name: lab, master: {nodes[0].split()[0]}}}\nnodes:\n"
    for index, spec in enumerate(nodes, start=1):
        name, _, mode = spec.partition(" ")
        windows = f", os: windows, windows: {{mode: {mode}}}" if mode else ""
        text += f"  - {{name: {name}, host: 10.0.0.{index}{windows}}}\n"
    return load_inventory_text(text, "lab.yaml")


def test_a_native_node_beside_linux_or_wsl_nodes_is_refused_from_the_inventory() -> None:
    error = native_mix_error(_inventory("gpu1", "gpu2", "win1 native", "win2 wsl"))
    assert error is not None and error.exit_code == 2  # a configuration error, not a failed check
    text = str(error)
    assert text.startswith("lab.yaml: native Windows node win1 (windows.mode: native) cannot train with ")
    assert "gpu1, gpu2 (Linux) and win2 (Windows in WSL mode)" in text
    assert "UV (libuv) transport" in text and "only its TCP transport" in text and "gloo#386" in text
    assert "set windows: {mode: wsl} for win1, so that its ranks run" in text
    two = str(native_mix_error(_inventory("win1 native", "win2 native", "win3 wsl")))
    assert "nodes win1, win2 (windows.mode: native) cannot train with win3 (Windows in WSL mode)" in two
    assert "for win1, win2, so that their ranks" in two


def test_clusters_of_one_kind_of_torch_are_not_refused() -> None:
    assert native_mix_error(_inventory("win1 native", "win2 native")) is None
    assert native_mix_error(_inventory("gpu1", "win2 wsl")) is None
    assert native_mix_error(_inventory("gpu1", "gpu2")) is None
    assert native_mix_error(_inventory("win1 native")) is None


def test_wsl_node_without_mirrored_networking_warns() -> None:
    nat = replace(MIRRORED, networking_mode="nat")
    node = facts("w", os="windows", windows_info=WIN11, wsl=nat)
    verdict = check_windows(node, [facts("m"), node])
    assert verdict is not None and verdict.level == "warn"
    assert "networkingMode is NAT" in verdict.reason and "peers cannot reach" in verdict.reason
    assert "networkingMode=mirrored" in (verdict.fix or "") and ".wslconfig" in (verdict.fix or "")
    good = facts("w", os="windows", windows_info=WIN11, wsl=MIRRORED)
    assert check_windows(good, [facts("m"), good]).level == "ok"  # type: ignore[union-attr]


def test_wsl_node_that_cannot_run_its_distro_fails() -> None:
    wsl1 = replace(MIRRORED, distros=(WslDistro("Ubuntu-22.04", "Stopped", 1, True),))
    node = facts("w", os="windows", windows_info=WIN11, wsl=wsl1)
    verdict = check_windows(node, [node])
    assert verdict is not None and verdict.level == "fail" and "wsl --set-version" in verdict.reason
    debian = WindowsSettings(distro="Debian")
    missing = facts("w", os="windows", windows=debian, windows_info=WIN11, wsl=MIRRORED)
    verdict = check_windows(missing, [missing])
    assert verdict is not None and verdict.level == "fail" and "'Debian'" in verdict.reason


# -- interface on native Windows nodes (adapter names, facts/windows.py) -----------------------------


def _native(**over: Any) -> PreflightFacts:
    """A native Windows node whose route to the master goes through the adapter 'Ethernet 2'."""
    base = facts(
        "win",
        os="windows",
        windows=NATIVE,
        interface=over.pop("interface", None),
        route=Route("10.0.0.1", "10.0.0.1", "Ethernet 2", "10.0.0.2", False),
        addresses=(
            InterfaceAddress("Loopback Pseudo-Interface 1", "127.0.0.1", 8),
            InterfaceAddress("Ethernet 2", "10.0.0.2", 24),
            InterfaceAddress("WLAN 2", "192.168.178.20", 24),
        ),
        interfaces=("Ethernet 2", "WLAN 2", "Bluetooth-Netzwerkverbindung", "Loopback Pseudo-Interface 1"),
        hostname_address=None,
        down=("Bluetooth-Netzwerkverbindung",),
    )
    return replace(base, **over)


def test_native_windows_interface_is_the_adapter_name_from_the_route() -> None:
    verdict = check_interface(_native())
    assert verdict.level == "ok" and verdict.reason == "Ethernet 2 (10.0.0.2) routes to the master"
    assert verdict.data["gloo_socket_ifname"] == "Ethernet 2"


def test_native_windows_inventory_interface_is_checked_against_the_adapters() -> None:
    other = check_interface(_native(interface="WLAN 2"))
    assert other.level == "warn" and other.data["gloo_socket_ifname"] == "WLAN 2"
    assert other.data["source"] == "192.168.178.20"
    down = check_interface(_native(interface="Bluetooth-Netzwerkverbindung"))
    assert down.level == "fail" and "is not up here: gloo cannot use it" in down.reason
    assert "'Ethernet 2'" in (down.fix or "")
    missing = check_interface(_native(interface="Ethernet"))
    assert missing.level == "fail"
    assert missing.reason == (
        "interface 'Ethernet' (inventory) does not exist here; interfaces: 'Ethernet 2', 'WLAN 2', "
        "'Bluetooth-Netzwerkverbindung' (not up)"
    )


def test_native_windows_master_on_loopback_fails() -> None:
    local = Route("localhost", "127.0.0.1", "Loopback Pseudo-Interface 1", "127.0.0.1", True)
    verdict = check_interface(_native(route=local))
    assert verdict.level == "fail" and "loopback address" in verdict.reason


def test_native_windows_fixes_name_windows_tools() -> None:
    gone = check_interface(_native(route=None))
    assert gone.level == "fail" and "Find-NetRoute" in (gone.fix or "") and "iproute2" not in (gone.fix or "")
    no_route = check_interface(
        _native(route=WindowsRoute("m", "10.9.9.9", None, None, False, why="unreachable"))
    )
    assert no_route.reason == "no route from this node to the master's address 10.9.9.9 (unreachable)"
    assert "`Find-NetRoute -RemoteIPAddress 10.9.9.9`" in (no_route.fix or "")
    # Linux nodes keep their own tools in the same messages
    linux = check_interface(facts("w", route=Route("m", "10.9.9.9", None, None, False)))
    assert "`ip -4 route get 10.9.9.9`" in (linux.fix or "")
    unresolved = check_interface(facts("w", route=Route("master.lan", None, None, None, False)))
    assert "/etc/hosts" in (unresolved.fix or "")


# -- sudo ------------------------------------------------------------------------------------------

NO_SUDO = RootAccess("alice", None, "a password is required")


def test_a_user_without_passwordless_sudo_fails_when_the_pipeline_needs_root() -> None:
    v = check_root_access(facts("w", root_access=NO_SUDO), ["firewall", "time sync"])
    assert v is not None and v.level == "fail"
    assert v.reason.startswith(
        "alice cannot run root commands without a password here (a password is required)"
    )
    assert "firewall and time sync steps would stop here" in v.reason
    # the exact line to add, where, and the other ways out
    assert v.fix is not None
    assert "on w, as root: `echo 'alice ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/cluster-bootstrap" in v.fix
    assert "`visudo -c`" in v.fix and "or connect as root" in v.fix
    assert "firewall.manage: false, time.manage: false" in v.fix
    assert v.data == {
        "user": "alice",
        "method": None,
        "needed_by": ["firewall", "time sync"],
        "detail": "a password is required",
    }


def test_only_the_managed_step_is_named() -> None:
    v = check_root_access(facts("w", root_access=NO_SUDO), ["time sync"])
    assert v is not None and v.level == "fail"
    assert "the main pipeline's time sync step would stop here" in v.reason
    assert v.fix is not None and v.fix.endswith("time.manage: false in the inventory")


def test_without_a_step_that_needs_root_it_is_a_warning() -> None:
    v = check_root_access(facts("w", root_access=RootAccess("alice", None, "sudo is not installed")), [])
    assert v is not None and v.level == "warn"
    assert "(sudo is not installed)" in v.reason and "runs neither" in v.reason
    assert v.fix is not None and "NOPASSWD" in v.fix


def test_root_logins_and_passwordless_sudo_pass() -> None:
    root = check_root_access(facts("w", root_access=RootAccess("root", "root")), ["firewall"])
    sudo = check_root_access(facts("w", root_access=RootAccess("alice", "sudo")), ["firewall"])
    assert root is not None and root.level == "ok" and root.reason.startswith("logged in as root")
    assert sudo is not None and sudo.level == "ok" and "`sudo -n`" in sudo.reason


def test_unknown_root_access_is_a_warning_and_windows_nodes_have_no_sudo_verdict() -> None:
    unknown = check_root_access(facts("w", root_access_error="timed out"), ["firewall"])
    assert unknown is not None and unknown.level == "warn" and "(timed out)" in unknown.reason
    assert (
        check_root_access(facts("w", os="windows", windows=WindowsSettings(mode="wsl")), ["firewall"]) is None
    )


def test_a_node_that_cannot_write_its_workdir_marker_fails_that_check_by_name() -> None:
    """One node's workdir is not writable (its marker write failed in its round trip): that node's
    workdir check fails naming the directory and the error, the others are judged as usual (it
    ended in a traceback when a node in the middle failed)."""
    from types import SimpleNamespace

    from orchestrator.inventory import load_inventory_text
    from orchestrator.steps.preflight import _workdir_check
    from orchestrator.steps.preflight.rounds import MARK, MARKS

    inventory = load_inventory_text(
        "nodes:\n"
        "  - {name: n1, host: 10.0.0.1, workdir: /w/n1}\n"
        "  - {name: n2, host: 10.0.0.2, workdir: /w/n2}\n"
        "  - {name: n3, host: 10.0.0.3, workdir: /w/n3}\n",
        "hosts.yaml",
    )
    tokens = {"n1": "t1", "n2": "t2", "n3": "t3"}
    said = {
        "n1": {MARK: ("", 0), MARKS: ("n1 t1\n", 0)},
        "n2": {MARK: ("touch: cannot touch '/w/n2/.m': Operation not permitted\n", 1), MARKS: ("", 1)},
        "n3": {MARK: ("", 0), MARKS: ("n3 t3\n", 0)},
    }
    listener = SimpleNamespace(done="complete", terminated=False)
    rounds: Any = {
        name: SimpleNamespace(listener=listener, section=lambda section, name=name: said[name][section])
        for name in said
    }
    verdicts = _workdir_check(None, inventory, list(inventory.nodes), rounds, tokens)  # type: ignore[arg-type]
    assert verdicts["n2"].level == "fail"
    assert "cannot write in /w/n2: touch: cannot touch" in verdicts["n2"].reason
    assert verdicts["n1"].level == verdicts["n3"].level == "ok"
