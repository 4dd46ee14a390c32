"""Facts of Windows nodes: the Windows build, CPUs, memory, Python, torch and GPUs, plus which modes
the node can run (native, WSL) and the Windows-side facts of a WSL node (:func:`gather_windows_side`).

Every command is PowerShell (the :class:`~orchestrator.platforms.PowerShell` dialect), gathered in one
script like the Linux facts. Parsers are pure functions of the printed text. WSL itself (installed?
which distributions, WSL 1 or 2, the ``.wslconfig`` networking mode) is facts/wsl.py; the route to the
master and the adapters of a native node are facts/windows_network.py.

Why modes matter (../shared/FIELD_NOTES.md): a native-Windows torch rank speaks gloo's UV transport,
a Linux rank the TCP one, so beside Linux nodes a Windows machine trains inside WSL2; and only WSL's
mirrored networking lets peers reach the ephemeral ports gloo listens on inside the distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.facts.base import Fact, FactParseError, FactSet, collect, fact_sections
from orchestrator.facts.linux import GpuReport, Gpus, MemoryInfo, PythonInfo, Torch, TorchInfo
from orchestrator.facts.windows_base import key_values, powershell_of
from orchestrator.facts.wsl import Wsl, WslInfo
from orchestrator.platforms import Platform
from orchestrator.platforms.powershell import NOT_FOUND_EXIT, PowerShell
from orchestrator.records import new_nonce
from orchestrator.transports.base import Transport

#: the Store stub ``python.exe`` (App Execution Alias without Python installed) and cmd.exe exit with
#: 9009 for "not installed"
STUB_EXIT = 9009
#: Windows 11 22H2: the first build with WSL's mirrored networking
MIRRORED_MIN_BUILD = 22621
#: what Windows Python launchers to try, in order, when the inventory names no interpreter
DEFAULT_PYTHONS: tuple[tuple[str, ...], ...] = (("py", "-3"), ("python",), ("python3",))

# -- Windows itself --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowsInfo:
    caption: str  # "Microsoft Windows 11 Pro"
    version: str  # "10.0.22631"
    build: int  # 22631
    ubr: int | None  # update build revision: 10.0.22631.<ubr>
    display_version: str | None  # "23H2" (None before 20H2, which used ReleaseId)
    architecture: str  # "64-bit"

    @property
    def windows11(self) -> bool:
        return self.build >= 22000  # Windows 11 kept the 10.0 version; only the build tells


class WindowsOs(Fact[WindowsInfo]):
    name = "windows"

    def command(self, platform: Platform) -> str:
        return (
            "$os = Get-CimInstance -ClassName Win32_OperatingSystem\n"
            # RegistryKey.GetValue: $null for a value this Windows lacks (no error to handle)
            "$key = Get-Item -LiteralPath 'HKLM:\\SOFTWARE\\Microsoft\\Windows NT\\CurrentVersion'\n"
            "'caption=' + $os.Caption\n"
            "'version=' + $os.Version\n"
            "'build=' + $os.BuildNumber\n"
            "'architecture=' + $os.OSArchitecture\n"
            "'osversion=' + [Environment]::OSVersion.Version.ToString()\n"
            "'ubr=' + $key.GetValue('UBR')\n"
            "'display_version=' + $key.GetValue('DisplayVersion')\n"
            "'release_id=' + $key.GetValue('ReleaseId')"
        )

    def parse(self, output: str, exit_code: int) -> WindowsInfo:
        values = key_values(output)
        if exit_code != 0 or "build" not in values:
            raise FactParseError("Win32_OperatingSystem gave no build number")
        ubr = values.get("ubr", "")
        return WindowsInfo(
            caption=values.get("caption", "Windows"),
            version=values.get("version", ""),
            build=int(values["build"]),
            ubr=int(ubr) if ubr.isdigit() else None,
            display_version=values.get("display_version") or values.get("release_id") or None,
            architecture=values.get("architecture", ""),
        )


class WindowsHostname(Fact[str]):
    name = "hostname"

    def command(self, platform: Platform) -> str:
        return "[System.Net.Dns]::GetHostName()"

    def parse(self, output: str, exit_code: int) -> str:
        value = output.strip()
        if exit_code != 0 or not value:
            raise FactParseError("no host name printed")
        return value


class WindowsCpuCount(Fact[int]):
    name = "cpus"

    def command(self, platform: Platform) -> str:
        # logical processors this process may use, like os.cpu_count() / nproc
        return "[Environment]::ProcessorCount"

    def parse(self, output: str, exit_code: int) -> int:
        return int(output.strip())


class WindowsMemory(Fact[MemoryInfo]):
    name = "memory"

    def command(self, platform: Platform) -> str:
        return (
            "$os = Get-CimInstance -ClassName Win32_OperatingSystem\n"
            "'total_kib=' + $os.TotalVisibleMemorySize\n"
            "'free_kib=' + $os.FreePhysicalMemory"
        )

    def parse(self, output: str, exit_code: int) -> MemoryInfo:
        values = key_values(output)
        return MemoryInfo(
            total_bytes=int(values["total_kib"]) * 1024,
            available_bytes=int(values.get("free_kib") or 0) * 1024,
        )


# -- programs: Python, torch, nvidia-smi -----------------------------------------------------------


def _first_working(ps: PowerShell, candidates: Sequence[Sequence[str]], args: Sequence[str]) -> str:
    """Try each candidate program (with its own leading arguments) with ``args``; stop at the first
    that exits 0. ``$LASTEXITCODE`` is 127 when none exists, else the last one's code."""
    lines = ["$cbFound = $false"]
    for candidate in candidates:
        lines.append(
            f"if (-not $cbFound) {{\n{ps.native([*candidate, *args])}\n"
            f"  if ($global:LASTEXITCODE -eq 0) {{ $cbFound = $true }}\n}}"
        )
    return "\n".join(lines)


def _candidates(interpreter: str | None) -> tuple[tuple[str, ...], ...]:
    return ((interpreter,),) if interpreter else DEFAULT_PYTHONS


class WindowsPython(Fact["PythonInfo | None"]):
    """Windows Python (native mode): the inventory's interpreter, else ``py -3``, ``python``,
    ``python3``; ``None`` when none runs (the Store's ``python.exe`` stub counts as none)."""

    name = "python"

    def __init__(self, interpreter: str | None = None) -> None:
        self.interpreter = interpreter

    def command(self, platform: Platform) -> str:
        code = "import sys; print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])"
        return _first_working(powershell_of(platform), _candidates(self.interpreter), ["-c", code])

    def parse(self, output: str, exit_code: int) -> PythonInfo | None:
        if exit_code in (NOT_FOUND_EXIT, STUB_EXIT):
            return None
        if exit_code != 0:
            raise FactParseError(f"{self.interpreter or 'python'} failed (exit code {exit_code})")
        path, version = output.strip().splitlines()[-2:]
        return PythonInfo(path=path.strip(), version=version.strip())


class WindowsTorch(Torch):
    """torch in Windows Python (native mode); the same probe as on Linux, in a section of its own
    (Windows' Python fact tries several interpreters)."""

    shared_section = ""

    def __init__(self, interpreter: str | None = None) -> None:
        super().__init__(interpreter or "python")
        self.candidates = _candidates(interpreter)

    def command(self, platform: Platform) -> str:
        from importlib import resources

        probe = resources.files("orchestrator.facts.probes").joinpath("torch_facts.py").read_text()
        return _first_working(powershell_of(platform), self.candidates, ["-c", probe])

    def parse(self, output: str, exit_code: int) -> TorchInfo | None:
        if exit_code == STUB_EXIT:
            return None
        return super().parse(output, exit_code)


class WindowsGpus(Gpus):
    """nvidia-smi (System32 since driver 4xx, or the older NVSMI folder), same query as on Linux."""

    def command(self, platform: Platform) -> str:
        ps = powershell_of(platform)
        query = ["--query-gpu=" + self.FIELDS, "--format=csv,noheader,nounits"]
        nvsmi = "C:\\Program Files\\NVIDIA Corporation\\NVSMI\\nvidia-smi.exe"
        return (
            "if (Get-Command -CommandType Application -Name nvidia-smi -ErrorAction SilentlyContinue) {\n"
            f"{ps.native(['nvidia-smi', *query])}\n"
            f"}} elseif (Test-Path -LiteralPath {ps.quote(nvsmi)}) {{\n"
            f"{ps.native([nvsmi, *query])}\n"
            f"}} else {{ $global:LASTEXITCODE = {NOT_FOUND_EXIT} }}"
        )

    def parse(self, output: str, exit_code: int) -> GpuReport:
        return super().parse(output.replace("\r", ""), exit_code)


# -- modes -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModesInfo:
    """Which ``windows.mode`` values this node can run (``modes``) and why the others cannot."""

    modes: tuple[str, ...]
    reasons: dict[str, str] = field(default_factory=dict)
    distro: str | None = None  # the distribution wsl mode would use
    networking_mode: str | None = None


def wsl_blocker(wsl: WslInfo | None, windows: WindowsInfo | None, distro: str | None) -> str | None:
    """Why this node cannot train in WSL mode with peers on the LAN (None: it can)."""
    if wsl is None:
        return "WSL facts are missing (see the wsl fact's error)"
    if not wsl.installed:
        return "WSL is not installed: run `wsl --install` as administrator, then reboot"
    error = (wsl.error or "").lower()
    if "cannot be accessed" in error:
        return (
            "wsl.exe cannot run in this remote session (Store WSL before 2.0 fails from WinRM and SSH "
            "sessions, microsoft/WSL#9231): run `wsl --update` on the machine"
        )
    if not wsl.distros:
        return "no WSL distribution is installed for this user: `wsl --install -d Ubuntu` (as this user)"
    chosen = wsl.distro(distro)
    if chosen is None:
        names = ", ".join(d.name for d in wsl.distros)
        which = f"distribution '{distro}'" if distro else "a default distribution"
        return f"no {which} for this user (installed: {names}): set windows.distro to one of them"
    if chosen.version != 2:
        return f"distribution '{chosen.name}' runs WSL 1: convert it with `wsl --set-version {chosen.name} 2`"
    if wsl.networking_mode != "mirrored":
        if windows is not None and windows.build < MIRRORED_MIN_BUILD:
            return (
                f"networkingMode is {wsl.networking_mode.upper()}: peers cannot reach the distro, and "
                f"mirrored networking needs Windows 11 22H2 (build {MIRRORED_MIN_BUILD}) or newer; "
                f"this is build {windows.build}"
            )
        return (
            f"networkingMode is {wsl.networking_mode.upper()}: peers cannot reach the distro; set "
            "networkingMode=mirrored under [wsl2] in %UserProfile%\\.wslconfig (Windows 11 22H2+), "
            "then `wsl --shutdown`"
        )
    return None


def windows_modes(
    values: Mapping[str, Any], distro: str | None = None, *, wsl_node: bool = False
) -> ModesInfo:
    """The modes a Windows node can run, from its gathered facts (``windows``, ``wsl``, and Windows
    Python: ``python`` on a native node, ``windows_python`` on a WSL node, whose ``python`` is the
    distribution's)."""
    wsl = values.get("wsl")
    windows = values.get("windows")
    reasons: dict[str, str] = {}
    modes = []
    blocker = wsl_blocker(wsl if isinstance(wsl, WslInfo) else None, windows, distro)
    if blocker is None:
        modes.append("wsl")
    else:
        reasons["wsl"] = blocker
    python = values.get("windows_python" if wsl_node else "python")
    if isinstance(python, PythonInfo):
        modes.append("native")
    else:
        reasons["native"] = (
            "no Windows Python found (tried py -3, python, python3): install Python from python.org "
            "(not the Store alias), or set python: to its path"
        )
    chosen = wsl.distro(distro) if isinstance(wsl, WslInfo) else None
    return ModesInfo(
        modes=tuple(modes),
        reasons=reasons,
        distro=chosen.name if chosen else distro,
        networking_mode=wsl.networking_mode if isinstance(wsl, WslInfo) else None,
    )


class WindowsPythonAside(WindowsPython):
    """Windows Python reported beside the distribution's own ``python`` (WSL-mode nodes)."""

    name = "windows_python"


def windows_facts(interpreter: str | None, *, mode: str = "native") -> list[Fact[Any]]:
    """The Windows-side facts `bootstrap check` gathers. Native mode: the node itself (hostname,
    CPUs, memory, Python, torch, GPUs) plus Windows and WSL. WSL mode: only what the Windows side
    knows (Windows, WSL, Windows Python for the modes table); the rest comes from inside the
    distribution, gathered with :func:`~orchestrator.facts.linux.linux_facts`."""
    if mode == "wsl":
        return [WindowsOs(), Wsl(), WindowsPythonAside(None)]
    return [
        WindowsHostname(),
        WindowsOs(),
        WindowsCpuCount(),
        WindowsMemory(),
        WindowsPython(interpreter),
        WindowsGpus(),
        WindowsTorch(interpreter),
        Wsl(),
    ]


# -- a WSL-mode node: the Windows side and the distribution ------------------------------------------


def gather_windows_side(transport: Transport, facts: list[Fact[Any]], *, timeout: float = 120.0) -> FactSet:
    """The Windows-side facts of a WSL node (``windows``, ``wsl``, ``windows_python``) in one
    PowerShell round trip; the distribution's own facts are a second one, through wsl.exe
    (:func:`~orchestrator.facts.base.gather` on the node's WSL platform).

    Two round trips, not one script starting wsl.exe from PowerShell: the distribution's facts then
    travel exactly like every other command for that node (the ``wsl.exe ... -e /bin/sh -c`` line),
    and when WSL is broken the Windows side still answers and says why."""
    ps = PowerShell()
    token = new_nonce()
    script = ps.sectioned(fact_sections(facts, ps), token)
    result = transport.run_windows(script, timeout=timeout)
    return collect(facts, result, token)
