"""Windows facts: parsers against recorded-style outputs of Windows 10/11 (data/facts/windows/),
wsl.exe's UTF-16 output, the modes a node can run, and the scripts (parsed with tree-sitter)."""

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
    WslDistro,
    WslInfo,
    decode_wsl_bytes,
    decode_wsl_text,
    parse_wslconfig,
    windows_facts,
    windows_modes,
)
from orchestrator.inventory.model import Node, WindowsSettings
from orchestrator.platforms import PowerShell, WslShell
from orchestrator.steps.inspect import facts_plan, inspect
from orchestrator.transports.base import Result
from tests import pwsh
from tests.unit.test_platform_powershell import split_command_line

DATA = Path(__file__).parent / "data" / "facts" / "windows"
CASES = sorted(DATA.glob("*.json"))
ps = PowerShell()


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_fact_parses_recorded_output(path: Path) -> None:
    case = json.loads(path.read_text())
    fact = getattr(windows_module, case["fact"])(*case["args"])
    value = fact.parse(case["output"], case["exit_code"])
    assert json.loads(json.dumps(public_value(value))) == case["expected"]


def test_every_windows_fact_class_has_recorded_cases() -> None:
    covered = {json.loads(p.read_text())["fact"] for p in CASES}
    classes = {type(f).__name__ for f in windows_facts(None)} - {"WindowsTorch"}  # the Linux probe's parser
    assert classes <= covered


@pytest.mark.parametrize("mode", ["native", "wsl"])
def test_every_command_parses_as_powershell(mode: str) -> None:
    for fact in windows_facts("C:\\Python311\\python.exe", mode=mode):
        pwsh.assert_parses(fact.command(ps))
    script = ps.wrap(ps.sectioned([(f.name, f.command(ps)) for f in windows_facts(None)], "cb-1"))
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
    """A WinRM transport's surface: the Windows side answers from recorded outputs; commands for the
    distribution go the real way, a ``wsl.exe ... -e /bin/sh -c`` command line, whose argv after
    ``-e`` runs for real on this machine (it is POSIX)."""

    kind = "winrm"

    def __init__(self, platform: Any, recorded: dict[str, str]) -> None:
        self.platform = platform
        self.recorded = recorded
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
        token = re.search(r"@@(cb-[0-9a-f]+) begin", script)
        assert token
        out = []
        for name, text in self.recorded.items():
            tok = token.group(1)
            out.append(f"@@{tok} begin {name}@@\r\n{text}\r\n\r\n@@{tok} end {name} 0@@\r\n")
        return Result("win", script, 0, "".join(out), "", 0.1)

    def run(self, command: str, *, timeout: float | None = None, **_: Any) -> Result:
        line = self.platform.login_command(self.platform.wrap(command))
        self.lines.append(line)
        argv = split_command_line(line)
        assert argv[0] == "wsl.exe"
        inner = argv[argv.index("-e") + 1 :]
        done = subprocess.run(inner, capture_output=True, text=True, timeout=120, check=False)
        return Result("win", command, done.returncode, done.stdout, done.stderr, 0.1)


def recorded(name: str) -> str:
    return str(json.loads((DATA / f"{name}.json").read_text())["output"])


def test_wsl_node_gathers_windows_and_linux_facts_in_two_round_trips() -> None:
    node = Node(name="win", host="10.0.0.5", os="windows", python="/nonexistent/python3")
    transport = FakeWinRM(
        WslShell(),
        {
            "windows": recorded("os_win11_23h2"),
            "wsl": recorded("wsl_win11_mirrored"),
            "windows_python": recorded("python_found"),
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
    assert "cat /etc/os-release" in linux_side
