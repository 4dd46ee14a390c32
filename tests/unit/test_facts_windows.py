"""Windows facts: parsers against outputs of Windows 10/11 composed by hand, not recorded
(data/facts/windows/, see its README), wsl.exe's UTF-16 output, the modes a node can run, and the
scripts (parsed with tree-sitter)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.facts import public_value
from orchestrator.facts import windows as windows_module
from orchestrator.facts.linux import PythonInfo
from orchestrator.facts.windows import (
    ModesInfo,
    WindowsInfo,
    windows_facts,
    windows_modes,
)
from orchestrator.facts.wsl import (
    WslDistro,
    WslInfo,
    decode_wsl_bytes,
    decode_wsl_text,
    parse_wslconfig,
)
from orchestrator.inventory.model import Node, WindowsSettings
from orchestrator.platforms import PowerShell, WslShell
from orchestrator.steps.node_facts import facts_plan, inspect
from orchestrator.transports.base import Result
from tests import pwsh
from tests.noderecords import NONCE, sections_asked, sections_said
from tests.unit.test_platform_powershell import split_command_line

DATA = Path(__file__).parent / "data" / "facts" / "windows"
CASES = sorted(DATA.glob("*.json"))
ps = PowerShell()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fact_parses_composed_output(path: Path) -> None:
    case = json.loads(path.read_text())
    fact = getattr(windows_module, case["fact"])(*case["args"])
    value = fact.parse(case["output"], case["exit_code"])
    assert json.loads(json.dumps(public_value(value))) == case["expected"]


def test_every_windows_fact_class_has_composed_cases() -> None:
    covered = {json.loads(p.read_text())["fact"] for p in CASES}
    classes = {type(f).__name__ for f in windows_facts(None)} - {"WindowsTorch"}  # the Linux probe's parser
    assert classes <= covered


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_every_command_parses_as_powershell(mode: str) -> None:
    for fact in windows_facts("C:\\Python311\\python.exe", mode=mode):
        pwsh.assert_parses(fact.command(ps))
    script = ps.wrap(ps.sectioned([(f.name, f.command(ps)) for f in windows_facts(None)], NONCE))
    tree = pwsh.assert_parses(script)
    cim = [c for c in pwsh.commands(tree) if c.name == "Get-CimInstance"]
    assert any(c.has("-ClassName") and c.arguments == ["Win32_OperatingSystem"] for c in cim)
    calls = [c for c in pwsh.commands(tree) if c.name == "Invoke-CbWsl"]
    assert [c.arguments for c in calls] == [
        ["'version'", "'--version'"],
        ["'status'", "'--status'"],
        ["'list'", "'--list --verbose'"],
    ]


def test_python_candidates_are_tried_in_order() -> None:
    script = windows_module.WindowsPython(None).command(ps)
    tree = pwsh.assert_parses(script)
    names = [
        next(a for a in c.arguments if a.startswith("'"))
        for c in pwsh.commands(tree)
        if c.name == "Get-Command" and c.has("-Name")
    ]
    assert names == ["'py'", "'python'", "'python3'"]
    one = windows_module.WindowsPython("C:\\Py\\python.exe").command(ps)
    assert "'C:\\Py\\python.exe'" in one and "'py'" not in one


# -- wsl.exe output ----------------------------------------------------------------------------------


def test_wsl_utf16_output_is_decoded() -> None:
    text = "  NAME      STATE           VERSION\r\n* Ubuntu    Running         2\r\n"
    assert decode_wsl_bytes(text.encode("utf-16-le")) == text.replace("\r", "")
    assert decode_wsl_bytes(b"\xff\xfe" + text.encode("utf-16-le")) == text.replace("\r", "")
    assert decode_wsl_bytes(text.encode()) == text.replace("\r", "")  # WSL_UTF8=1
    # UTF-16 read as single bytes (what `& wsl.exe` gives in PowerShell, ansible.windows#481)
    misread = text.encode("utf-16-le").decode("latin-1")
    assert decode_wsl_text(misread) == text.replace("\r", "")


def test_utf16_read_as_bytes_still_parses() -> None:
    case = json.loads((DATA / "wsl_win11_mirrored.json").read_text())
    misread = case["output"].encode("utf-16-le").decode("latin-1")
    value = windows_module.Wsl().parse(misread, 0)
    assert json.loads(json.dumps(public_value(value))) == case["expected"]


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("", "nat"),
        ("[wsl2]\nmemory=8GB\n", "nat"),
        ("[wsl2]\nnetworkingMode=mirrored\n", "mirrored"),
        ("[WSL2]\n  NETWORKINGMODE = Mirrored  # peers\n", "mirrored"),
        ("[wsl2]\n#networkingMode=mirrored\n", "nat"),
        ("[wsl2]\nnetworkingMode=NAT\n[experimental]\nnetworkingMode=mirrored\n", "nat"),
        ("[experimental]\nnetworkingMode=mirrored\n", "mirrored"),
        ('[wsl2]\nnetworkingMode="mirrored"\n', "mirrored"),
        ("[boot]\nnetworkingMode=mirrored\n", "nat"),
    ],
)
def test_wslconfig_networking_mode(text: str, mode: str) -> None:
    assert parse_wslconfig(text) == mode


# -- modes -------------------------------------------------------------------------------------------

WIN11 = WindowsInfo("Microsoft Windows 11 Pro", "10.0.22631", 22631, 2861, "23H2", "64-bit")
WIN10 = WindowsInfo("Microsoft Windows 10 Pro", "10.0.19045", 19045, 3803, "22H2", "64-bit")
UBUNTU = WslDistro("Ubuntu-22.04", "Running", 2, True)
MIRRORED = WslInfo(installed=True, version="2.0.9.0", distros=(UBUNTU,), networking_mode="mirrored")
PY = PythonInfo("C:\\Python311\\python.exe", "3.11.9")


def modes(**values: Any) -> ModesInfo:
    distro = values.pop("distro", None)
    return windows_modes(values, distro)


def test_a_ready_machine_can_run_both_modes() -> None:
    found = modes(windows=WIN11, wsl=MIRRORED, python=PY)
    assert found.modes == ("wsl", "native") and found.reasons == {}
    assert found.distro == "Ubuntu-22.04" and found.networking_mode == "mirrored"


@pytest.mark.parametrize(
    ("wsl", "windows", "distro", "words"),
    [
        (WslInfo(installed=False), WIN11, None, ["not installed", "wsl --install"]),
        (
            WslInfo(installed=True, error="The file cannot be accessed by the system."),
            WIN11,
            None,
            ["wsl --update"],
        ),
        (WslInfo(installed=True, error="no installed distributions"), WIN11, None, ["wsl --install -d"]),
        (MIRRORED, WIN11, "Debian", ["'Debian'", "Ubuntu-22.04", "windows.distro"]),
        (
            WslInfo(
                installed=True, distros=(WslDistro("Old", "Stopped", 1, True),), networking_mode="mirrored"
            ),
            WIN11,
            None,
            ["WSL 1", "wsl --set-version Old 2"],
        ),
        (
            WslInfo(installed=True, distros=(UBUNTU,)),
            WIN11,
            None,
            ["networkingMode is NAT", "networkingMode=mirrored", ".wslconfig", "22H2"],
        ),
        (WslInfo(installed=True, distros=(UBUNTU,)), WIN10, None, ["build 22621", "this is build 19045"]),
    ],
)
def test_wsl_mode_blockers_say_what_to_do(
    wsl: WslInfo, windows: WindowsInfo, distro: str | None, words: list[str]
) -> None:
    found = modes(windows=windows, wsl=wsl, python=PY, distro=distro)
    assert found.modes == ("native",)
    for word in words:
        assert word in found.reasons["wsl"]


def test_distro_names_compare_like_wsl() -> None:
    assert modes(windows=WIN11, wsl=MIRRORED, distro="ubuntu-22.04").modes[0] == "wsl"


def test_native_needs_windows_python() -> None:
    found = modes(windows=WIN11, wsl=MIRRORED, python=None)
    assert found.modes == ("wsl",) and "python.org" in found.reasons["native"]
    # a WSL node's `python` is the distribution's: Windows Python is `windows_python` there
    on_wsl = windows_modes({"windows": WIN11, "wsl": MIRRORED, "python": PY}, None, wsl_node=True)
    assert on_wsl.modes == ("wsl",)


# -- wiring: dry-run plans and one round trip -----------------------------------------------------------


class FakeWinRM:
    """A WinRM transport's surface: the Windows side answers from composed outputs; commands for the
    distribution go the real way, a ``wsl.exe ... -e /bin/sh -c`` command line, whose argv after
    ``-e`` runs for real on this machine (it is POSIX)."""

    kind = "winrm"
    reaches_windows_host = True  # WinRM's shell is Windows' own, also under a WSL node

    def __init__(self, platform: Any, composed: dict[str, str]) -> None:
        self.platform = platform
        self.composed = composed
        self.windows_scripts: list[str] = []
        self.lines: list[str] = []
        self.recorded_host_keys: list[str] = []

    def connect(self) -> None:
        pass

    def describe(self) -> str:
        return "winrm https://win:5986 (fake)"

    def run_windows(self, script: str, *, timeout: float | None = None) -> Result:
        self.windows_scripts.append(script)
        pwsh.assert_parses(script)
        ((token, _), *_) = sections_asked(script)
        out = sections_said(token, {name: (text, 0) for name, text in self.composed.items()})
        return Result("win", script, 0, out.replace("\n", "\r\n"), "", 0.1)

    def run(self, command: str, *, timeout: float | None = None, **_: Any) -> Result:
        line = self.platform.login_command(self.platform.wrap(command))
        self.lines.append(line)
        argv = split_command_line(line)
        assert argv[0] == "wsl.exe"
        inner = argv[argv.index("-e") + 1 :]
        done = subprocess.run(inner, capture_output=True, text=True, timeout=120, check=False)
        return Result("win", command, done.returncode, done.stdout, done.stderr, 0.1)


def composed(name: str) -> str:
    return str(json.loads((DATA / f"{name}.json").read_text())["output"])


def test_wsl_node_gathers_windows_and_linux_facts_in_two_round_trips() -> None:
    node = Node(name="win", host="10.0.0.5", os="windows", python="/nonexistent/python3")
    transport = FakeWinRM(
        WslShell(),
        {
            "windows": composed("os_win11_23h2"),
            "wsl": composed("wsl_win11_mirrored"),
            "windows_python": composed("python_found"),
        },
    )
    found = inspect(node, transport)  # type: ignore[arg-type]
    assert len(transport.windows_scripts) == 1 and len(transport.lines) == 1
    values = found.facts.values
    assert values["windows"].build == 22631 and values["wsl"].networking_mode == "mirrored"
    assert values["hostname"] and values["cpus"] >= 1  # from inside the "distribution" (here: this machine)
    assert values["python"] is None  # the inventory's interpreter is missing in the distribution
    assert values["modes"].modes == ("wsl", "native")
    json.dumps(found.public_dict())


def test_native_node_plan_parses_and_skips_posix_extras() -> None:
    from orchestrator.facts.network import Addresses

    node = Node(name="win", host="10.0.0.5", os="windows", windows=WindowsSettings(mode="native"))
    plan = facts_plan(node, FakeWinRM(ps, {}), [Addresses()])  # type: ignore[arg-type]
    tree = pwsh.assert_parses(plan)
    assert "ip -o" not in plan and any(c.name == "Set-StrictMode" for c in pwsh.commands(tree))


def test_wsl_node_plan_shows_both_scripts() -> None:
    node = Node(name="win", host="10.0.0.5", os="windows", windows=WindowsSettings(distro="Ubuntu"))
    plan = facts_plan(node, FakeWinRM(WslShell("Ubuntu"), {}))  # type: ignore[arg-type]
    windows_side, _, linux_side = plan.partition("\n# then, inside the WSL distribution:\n")
    tree = pwsh.assert_parses(windows_side)
    calls = [c.arguments for c in pwsh.commands(tree) if c.name == "Invoke-CbWsl"]
    assert calls[0] == ["'version'", "'--version'"]
    assert "</etc/os-release" in linux_side


# -- native nodes: the route to the master and the adapters ----------------------------------------------
#
# Recorded-style outputs: what the two network facts print through their own format on a Windows 11
# 23H2 machine (German UI: "WLAN"; a USB adapter renamed "Büro LAN"), with the values Get-NetAdapter,
# Get-NetIPAddress and Find-NetRoute give there. Composed from those cmdlets' documented objects, not
# captured from a machine: that they print exactly this is what a real Windows host proves.

ADAPTERS_WIN11 = (
    "adapter=6|Up|Ethernet 2\r\n"
    "description=6|Intel(R) Ethernet Controller I225-V\r\n"
    "adapter=9|Up|Büro LAN\r\n"
    "description=9|Realtek USB GbE Family Controller\r\n"
    "adapter=14|Disconnected|WLAN\r\n"
    "description=14|Intel(R) Wi-Fi 6E AX211 160MHz\r\n"
    "adapter=22|Up|vEthernet (WSL (Hyper-V firewall))\r\n"
    "description=22|Hyper-V Virtual Ethernet Adapter\r\n"
    "adapter=31|Up|corp-vpn\r\n"
    "description=31|WireGuard Tunnel\r\n"
    "address=IPv4|127.0.0.1|8|Preferred|Loopback Pseudo-Interface 1\r\n"
    "address=IPv6|::1|128|Preferred|Loopback Pseudo-Interface 1\r\n"
    "address=IPv6|fe80::5d1c:9a2e:41b7:8c03%6|64|Preferred|Ethernet 2\r\n"
    "address=IPv4|192.168.1.101|24|Preferred|Ethernet 2\r\n"
    "address=IPv4|10.10.0.5|24|Preferred|Büro LAN\r\n"
    "address=IPv4|169.254.37.112|16|Tentative|WLAN\r\n"
    "address=IPv4|172.29.80.1|20|Preferred|vEthernet (WSL (Hyper-V firewall))\r\n"
    "address=IPv4|10.200.0.7|32|Preferred|corp-vpn\r\n"
)


def route_output(
    address: str, source: str, index: int, alias: str, prefix: str, *, local: bool = False
) -> str:
    return (
        f"resolved={address}\r\nlocal={local}\r\nsource={source}\r\nindex={index}\r\ninterface={alias}\r\n"
        f"prefix={prefix}\r\nnexthop=0.0.0.0\r\nroute_interface={alias}\r\n"
    )


ROUTE_LAN = route_output("192.168.1.100", "192.168.1.101", 6, "Ethernet 2", "192.168.1.0/24")
ROUTE_OFFICE = route_output("10.10.0.1", "10.10.0.5", 9, "Büro LAN", "10.10.0.0/24")
ROUTE_VPN = route_output("10.200.0.1", "10.200.0.7", 31, "corp-vpn", "10.200.0.0/24")
ROUTE_SELF = route_output("192.168.1.101", "192.168.1.101", 6, "Ethernet 2", "192.168.1.101/32", local=True)
ROUTE_UNREACHABLE = (
    "resolved=172.16.5.1\r\nlocal=False\r\nroute_error=The network location cannot be reached. For "
    "information about network troubleshooting, see Windows Help.\r\n"
)
ROUTE_UNRESOLVED = (
    'resolve_error=Exception calling "GetHostAddresses" with "1" argument(s): "No such host is known"\r\n'
    "resolved=\r\n"
)

NATIVE_MODE = WindowsSettings(mode="native")


def test_route_script_quotes_the_master_host_and_parses() -> None:
    from orchestrator.facts.windows_network import WindowsMasterRoute

    for host in (
        "win-a.lan",
        "192.168.1.100",
        "o'brien-pc",
        "ma\u2019ster",
        "x'; Remove-Item -Recurse C:\\; '",
    ):
        tree = pwsh.assert_parses(WindowsMasterRoute(host).command(ps))
        target = [
            n.children[-1].text.decode()
            for n in pwsh.walk(tree.root_node)
            if n.type == "assignment_expression" and n.children[0].text == b"$cbTarget"
        ]
        assert len(target) == 1 and target[0].startswith("'") and target[0].endswith("'")
        assert re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", target[0][1:-1]) == host
        names = [c.name for c in pwsh.commands(tree)]
        assert "Remove-Item" not in names  # the host stays one literal, never code
        route = [c for c in pwsh.commands(tree) if c.name == "Find-NetRoute"]
        assert [(c.parameters, c.arguments) for c in route] == [(["-remoteipaddress"], ["$cbAddress"])]


def test_adapter_script_parses_and_reads_both_cmdlets() -> None:
    from orchestrator.facts.windows_network import WindowsAdapters

    tree = pwsh.assert_parses(WindowsAdapters().command(ps))
    assert {"Get-NetAdapter", "Get-NetIPAddress"} <= {c.name for c in pwsh.commands(tree)}
    # and the preflight's script for a native node: both facts in one sectioned PowerShell script
    from orchestrator.steps.preflight import preflight_facts

    node = Node(name="win", host="10.0.0.5", os="windows", windows=NATIVE_MODE)
    # a quote the inventory refuses in a host: constructed unchecked, the script still quotes it
    facts = preflight_facts(node, Node.model_construct(name="m", host="o'head"))
    assert [f.name for f in facts] == ["route", "adapters"]
    pwsh.assert_parses(ps.wrap(ps.sectioned([(f.name, f.command(ps)) for f in facts], NONCE)))


def test_route_outputs_parse_into_the_linux_route_model() -> None:
    from orchestrator.facts.network import Route
    from orchestrator.facts.windows_network import WindowsMasterRoute

    fact = WindowsMasterRoute("win-master.lan")
    lan = fact.parse(ROUTE_LAN, 0)
    assert isinstance(lan, Route) and lan.detail is None
    assert (lan.target, lan.address, lan.interface, lan.source, lan.local) == (
        "win-master.lan",
        "192.168.1.100",
        "Ethernet 2",
        "192.168.1.101",
        False,
    )
    assert fact.parse(ROUTE_OFFICE, 0).interface == "Büro LAN"
    assert fact.parse(ROUTE_SELF, 0).local
    unreachable = fact.parse(ROUTE_UNREACHABLE, 0)
    assert unreachable.address == "172.16.5.1" and unreachable.interface is None
    assert unreachable.detail and "cannot be reached" in unreachable.detail
    unresolved = fact.parse(ROUTE_UNRESOLVED, 0)
    assert unresolved.address is None and "No such host is known" in (unresolved.detail or "")


def test_adapter_output_parses_names_states_and_usable_addresses() -> None:
    from orchestrator.facts.windows_network import WindowsAdapters

    network = WindowsAdapters().parse(ADAPTERS_WIN11, 0)
    assert [a.name for a in network.adapters] == [
        "Ethernet 2",
        "Büro LAN",
        "WLAN",
        "vEthernet (WSL (Hyper-V firewall))",
        "corp-vpn",
    ]
    assert network.adapter("WLAN").description == "Intel(R) Wi-Fi 6E AX211 160MHz"  # type: ignore[union-attr]
    assert network.down == ("WLAN",)
    assert "Loopback Pseudo-Interface 1" in network.interfaces  # not an adapter, but gloo lists it
    ipv4 = {(a.interface, a.address, a.prefix) for a in network.addresses}
    assert ("Büro LAN", "10.10.0.5", 24) in ipv4 and ("Loopback Pseudo-Interface 1", "127.0.0.1", 8) in ipv4
    assert not any(a.interface == "WLAN" for a in network.addresses)  # Tentative APIPA: not usable
    assert [a.address for a in network.ipv6 if a.interface == "Ethernet 2"] == ["fe80::5d1c:9a2e:41b7:8c03%6"]
    json.dumps(public_value(network))


class FakeNativeWinRM:
    """A native node's WinRM transport: every PowerShell script is parsed, then answered section by
    section from composed outputs (a missing one: no output, exit code 1)."""

    kind = "winrm"

    def __init__(self, composed: dict[str, str]) -> None:
        self.platform = ps
        self.composed = composed
        self.scripts: list[str] = []
        self.recorded_host_keys: list[str] = []

    def connect(self) -> None:
        pass

    def describe(self) -> str:
        return "winrm https://win:5986 (fake)"

    def run(self, script: str, *, timeout: float | None = None, **_: Any) -> Result:
        self.scripts.append(script)
        pwsh.assert_parses(ps.wrap(script))
        out = []
        for token, name in sections_asked(script):
            code = 0 if name in self.composed else 1
            out.append(sections_said(token, {name: (self.composed.get(name, ""), code)}))
        return Result("win", script, 0, "".join(out).replace("\n", "\r\n"), "", 0.1)


NATIVE_INVENTORY = """\
cluster: {{name: win-only, master: win-m, backend: gloo}}
defaults: {{os: windows, user: .\\\\ml, password_env: WIN_PASS, windows: {{mode: native}}}}
nodes:
  - {{name: win-m, host: 192.168.1.101, python: 'C:\\Python312\\python.exe'}}
  - {{name: win-b, host: 192.168.1.102, python: 'C:\\Python312\\python.exe'{extra}}}
"""


def _native_preflight(route_b: str, adapters_b: str = ADAPTERS_WIN11, extra: str = "") -> dict[str, Any]:
    """Both nodes of an all-native cluster through the preflight's own gathering (inspect, then the
    network facts), the interface check, and the launch plan's GLOO_SOCKET_IFNAME."""
    from orchestrator.inventory import load_inventory_text
    from orchestrator.render import Renderer, plan_launch, render_all
    from orchestrator.steps.node_facts import inspect
    from orchestrator.steps.preflight import (
        _node_facts,
        check_interfaces,
        preflight_facts,
    )

    inventory = load_inventory_text(NATIVE_INVENTORY.format(extra=extra), "w.yaml")
    master = inventory.master_node
    answers = {
        "win-m": {"route": ROUTE_SELF, "adapters": ADAPTERS_WIN11},
        "win-b": {"route": route_b, "adapters": adapters_b},
    }
    facts, transports = [], {}
    for node in inventory.nodes:
        transport = FakeNativeWinRM({"hostname": node.name, "cpus": "8", **answers[node.name]})
        transports[node.name] = transport
        found = inspect(node, transport, preflight_facts(node, master))  # type: ignore[arg-type]
        assert not {"route", "adapters"} & set(found.facts.errors), found.facts.errors
        facts.append(_node_facts(node, found))
    verdicts = check_interfaces(facts, master.name, single=False)
    interfaces = {n: (v.data.get("gloo_socket_ifname"), v.data.get("source")) for n, v in verdicts.items()}
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr=verdicts[master.name].data.get("master_address") or master.host,
        run_id="r1",
        interfaces=interfaces,
        cpus={},
        pythons={n.name: n.python or "python" for n in inventory.nodes},
    )
    scripts = render_all(Renderer(), specs, {n.name: ps for n in inventory.nodes}, mask=True)
    env = {}
    for name, script in scripts.items():
        tree = pwsh.assert_parses(script)
        for n in pwsh.walk(tree.root_node):
            if n.type == "assignment_expression" and n.children[0].text == b"$env:GLOO_SOCKET_IFNAME":
                literal = n.children[-1].text.decode()
                env[name] = re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", literal[1:-1])
    return {"verdicts": verdicts, "env": env, "transports": transports}


def test_native_nodes_get_the_adapter_that_routes_to_the_master() -> None:
    found = _native_preflight(ROUTE_LAN.replace("192.168.1.100", "192.168.1.101"))
    verdicts = found["verdicts"]
    assert {v.level for v in verdicts.values()} == {"ok"}, {n: v.reason for n, v in verdicts.items()}
    assert verdicts["win-b"].reason == "Ethernet 2 (192.168.1.101) routes to the master"
    assert verdicts["win-m"].data["master_address"] == "192.168.1.101"  # its own address, found local
    assert found["env"] == {"win-m": "Ethernet 2", "win-b": "Ethernet 2"}  # the friendly name, exactly
    # one round trip: inspect's facts and the network facts in one script
    assert all(len(t.scripts) == 1 for t in found["transports"].values())


def test_a_renamed_adapter_with_a_space_and_umlaut_reaches_the_launch_script() -> None:
    office = ROUTE_OFFICE.replace("10.10.0.1", "192.168.1.101")
    found = _native_preflight(office)
    assert found["verdicts"]["win-b"].level == "ok"
    assert found["env"]["win-b"] == "Büro LAN"


def test_route_through_a_vpn_is_what_gloo_gets_and_an_inventory_interface_wins_with_a_warning() -> None:
    vpn = ROUTE_VPN.replace("10.200.0.1", "192.168.1.101")
    found = _native_preflight(vpn)
    assert found["verdicts"]["win-b"].level == "ok" and found["env"]["win-b"] == "corp-vpn"
    pinned = _native_preflight(vpn, extra=", interface: Ethernet 2")
    verdict = pinned["verdicts"]["win-b"]
    assert verdict.level == "warn"
    assert verdict.reason == (
        "interface Ethernet 2 (192.168.1.101, inventory) but the master is routed through corp-vpn"
    )
    assert pinned["env"]["win-b"] == "Ethernet 2"


@pytest.mark.parametrize(
    ("interface", "words"),
    [
        (
            "Ethernet",
            [
                "'Ethernet' (inventory) does not exist here; interfaces: 'Ethernet 2', 'Büro LAN', "
                "'WLAN' (not up), 'vEthernet (WSL (Hyper-V firewall))', 'corp-vpn' / set interface: to one",
            ],
        ),
        ("ethernet 2", ["does not exist here", "write it as 'Ethernet 2': gloo compares names exactly"]),
        ("Intel(R) Ethernet Controller I225-V", ["does not exist here"]),  # the description is no name
        ("WLAN", ["'WLAN' (inventory) is not up here: gloo cannot use it", "connect or enable it"]),
    ],
)
def test_a_wrong_inventory_interface_fails_saying_what_exists(interface: str, words: list[str]) -> None:
    found = _native_preflight(
        ROUTE_LAN.replace("192.168.1.100", "192.168.1.101"), extra=f", interface: '{interface}'"
    )
    verdict = found["verdicts"]["win-b"]
    assert verdict.level == "fail"
    text = f"{verdict.reason} / {verdict.fix}"
    for word in words:
        assert word in text, text


def test_an_unreachable_or_unresolvable_master_fails_with_the_windows_fix() -> None:
    verdict = _native_preflight(ROUTE_UNREACHABLE)["verdicts"]["win-b"]
    assert verdict.level == "fail"
    assert verdict.reason.startswith(
        "no route from this node to the master's address 172.16.5.1 (The network"
    )
    assert "Find-NetRoute -RemoteIPAddress 172.16.5.1" in (verdict.fix or "")
    verdict = _native_preflight(ROUTE_UNRESOLVED)["verdicts"]["win-b"]
    assert verdict.level == "fail" and "No such host is known" in verdict.reason
    assert "C:\\Windows\\System32\\drivers\\etc\\hosts" in (verdict.fix or "")


def test_a_node_resolving_the_master_elsewhere_fails() -> None:
    verdict = _native_preflight(ROUTE_LAN)["verdicts"]["win-b"]  # 192.168.1.100, the master is .101
    assert verdict.level == "fail" and "resolves the master 192.168.1.101 to 192.168.1.100" in verdict.reason
    assert "but the master is 192.168.1.101, its host in the inventory" in verdict.reason
    assert "drivers\\etc\\hosts" in (verdict.fix or "")
