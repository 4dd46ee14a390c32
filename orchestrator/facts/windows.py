"""Facts of Windows nodes: the Windows build, CPUs, memory, Python, GPUs, and WSL (installed? which
distributions, WSL 1 or 2, the ``.wslconfig`` networking mode), plus which modes the node can run.

Every command is PowerShell (the :class:`~orchestrator.platforms.PowerShell` dialect), gathered in one
script like the Linux facts. Parsers are pure functions of the printed text. ``wsl.exe`` writes
UTF-16LE whatever the console code page (only ``WSL_UTF8=1`` changes that): the commands read its
raw bytes and decode them (:data:`WSL_DECODER`), and the parsers drop the NULs of a UTF-16 text that
was read as bytes anyway (:func:`decode_wsl_text`).

Why modes matter (../shared/FIELD_NOTES.md): a native-Windows torch rank speaks gloo's UV transport,
a Linux rank the TCP one, so beside Linux nodes a Windows machine trains inside WSL2; and only WSL's
mirrored networking lets peers reach the ephemeral ports gloo listens on inside the distribution.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.facts.base import Fact, FactParseError, FactSet, collect
from orchestrator.facts.linux import GpuReport, Gpus, MemoryInfo, PythonInfo, Torch, TorchInfo
from orchestrator.facts.network import InterfaceAddress, Route
from orchestrator.platforms import Platform
from orchestrator.platforms.powershell import NOT_FOUND_EXIT, PowerShell
from orchestrator.transports.base import Result

#: the Store stub ``python.exe`` (App Execution Alias without Python installed) and cmd.exe exit with
#: 9009 for "not installed"
STUB_EXIT = 9009
#: Windows 11 22H2: the first build with WSL's mirrored networking
MIRRORED_MIN_BUILD = 22621
#: what Windows Python launchers to try, in order, when the inventory names no interpreter
DEFAULT_PYTHONS: tuple[tuple[str, ...], ...] = (("py", "-3"), ("python",), ("python3",))


def _ps(platform: Platform) -> PowerShell:
    if isinstance(platform, PowerShell):
        return platform
    windows = getattr(platform, "windows", None)
    if isinstance(windows, PowerShell):
        return windows
    raise FactParseError(f"Windows facts need PowerShell, not {platform.name}")


def _key_values(output: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    return values


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
        values = _key_values(output)
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
        values = _key_values(output)
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
        return _first_working(_ps(platform), _candidates(self.interpreter), ["-c", code])

    def parse(self, output: str, exit_code: int) -> PythonInfo | None:
        if exit_code in (NOT_FOUND_EXIT, STUB_EXIT):
            return None
        if exit_code != 0:
            raise FactParseError(f"{self.interpreter or 'python'} failed (exit code {exit_code})")
        path, version = output.strip().splitlines()[-2:]
        return PythonInfo(path=path.strip(), version=version.strip())


class WindowsTorch(Torch):
    """torch in Windows Python (native mode); the same probe as on Linux."""

    def __init__(self, interpreter: str | None = None) -> None:
        super().__init__(interpreter or "python")
        self.candidates = _candidates(interpreter)

    def command(self, platform: Platform) -> str:
        from importlib import resources

        probe = resources.files("orchestrator.facts.probes").joinpath("torch_facts.py").read_text()
        return _first_working(_ps(platform), self.candidates, ["-c", probe])

    def parse(self, output: str, exit_code: int) -> TorchInfo | None:
        if exit_code == STUB_EXIT:
            return None
        return super().parse(output, exit_code)


class WindowsGpus(Gpus):
    """nvidia-smi (System32 since driver 4xx, or the older NVSMI folder), same query as on Linux."""

    def command(self, platform: Platform) -> str:
        ps = _ps(platform)
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


# -- WSL -------------------------------------------------------------------------------------------

#: PowerShell: run wsl.exe with arguments, print ``--- <label> exit=<code>`` then its output decoded
#: (UTF-16LE unless it starts like ASCII UTF-8, which ``WSL_UTF8=1`` gives).
WSL_DECODER = """function Invoke-CbWsl([string]$label, [string]$arguments) {
  $info = New-Object -TypeName System.Diagnostics.ProcessStartInfo
  $info.FileName = $cbWslExe
  $info.Arguments = $arguments
  $info.UseShellExecute = $false
  $info.RedirectStandardOutput = $true
  $info.RedirectStandardError = $true
  $proc = [System.Diagnostics.Process]::Start($info)
  $errors = $proc.StandardError.BaseStream.CopyToAsync([System.IO.Stream]::Null)
  $buffer = New-Object -TypeName System.IO.MemoryStream
  $reading = $proc.StandardOutput.BaseStream.CopyToAsync($buffer)
  if (-not $proc.WaitForExit(60000)) {
    $proc.Kill()
    [Console]::Out.WriteLine('--- ' + $label + ' exit=timeout')
    return
  }
  $null = $reading.Wait(5000)
  $null = $errors.Wait(5000)
  $bytes = $buffer.ToArray()
  $text = ''
  if ($bytes.Length -ge 2 -and $bytes[1] -eq 0) {
    $text = [System.Text.Encoding]::Unicode.GetString($bytes)
  } else {
    $text = [System.Text.Encoding]::UTF8.GetString($bytes)
  }
  [Console]::Out.WriteLine('--- ' + $label + ' exit=' + $proc.ExitCode)
  [Console]::Out.WriteLine($text.TrimStart([char]0xFEFF))
}"""


@dataclass(frozen=True)
class WslDistro:
    name: str
    state: str  # Running, Stopped, Installing, Converting, Uninstalling
    version: int  # 1 or 2
    default: bool


@dataclass(frozen=True)
class WslInfo:
    installed: bool  # wsl.exe exists and answers
    version: str | None = None  # "2.0.9.0" (Store WSL); None: inbox WSL without --version
    kernel: str | None = None
    default_version: int | None = None  # what new distributions get
    distros: tuple[WslDistro, ...] = ()
    networking_mode: str = "nat"  # from .wslconfig [wsl2] networkingMode (lowercased); nat by default
    wslconfig: bool = False  # %UserProfile%\.wslconfig exists
    error: str | None = None  # wsl.exe answered with an error (first line)

    def distro(self, name: str | None) -> WslDistro | None:
        """The distribution called ``name`` (case-insensitive, as WSL compares), or the default one."""
        for d in self.distros:
            if (name is None and d.default) or (name is not None and d.name.lower() == name.lower()):
                return d
        return None


def decode_wsl_text(text: str) -> str:
    """wsl.exe output as text: a UTF-16LE text read as single bytes shows a NUL after each
    character; drop those and any byte-order mark."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    return text.replace("\ufeff", "").replace("\r", "")


def decode_wsl_bytes(data: bytes) -> str:
    """Raw wsl.exe output: UTF-16LE (its default) or UTF-8 (``WSL_UTF8=1``)."""
    if len(data) >= 2 and (data[1] == 0 or data[:2] == b"\xff\xfe"):
        return decode_wsl_text(data.decode("utf-16-le", errors="replace"))
    return decode_wsl_text(data.decode("utf-8", errors="replace"))


def _blocks(output: str) -> dict[str, tuple[str, str]]:
    """``--- label exit=N`` blocks -> {label: (exit code text, body)}."""
    blocks: dict[str, tuple[str, str]] = {}
    label: str | None = None
    code = ""
    lines: list[str] = []
    for line in decode_wsl_text(output).split("\n"):
        match = re.match(r"--- (\w+)(?: exit=(\S+))?$", line)
        if match:
            if label is not None:
                blocks[label] = (code, "\n".join(lines).strip("\n"))
            label, code, lines = match.group(1), match.group(2) or "", []
        elif label is not None:
            lines.append(line)
    if label is not None:
        blocks[label] = (code, "\n".join(lines).strip("\n"))
    return blocks


_VERSION = re.compile(r"\d+(?:\.\d+){1,3}")


def parse_wsl_version(body: str) -> tuple[str | None, str | None]:
    """``wsl --version`` -> (WSL version, kernel version). Lines are localized ("WSL-Version: ...")
    but always in this order: WSL first, kernel second."""
    found: list[str] = []
    for line in body.splitlines():
        if ":" not in line:
            continue
        match = _VERSION.search(line.split(":", 1)[1])
        if match:
            rest = line.split(":", 1)[1].strip()
            found.append(rest if found else match.group(0))
    if not found:
        return None, None
    kernel = found[1] if len(found) > 1 else None
    return found[0], kernel


def parse_wsl_list(body: str) -> tuple[WslDistro, ...]:
    """``wsl --list --verbose``: a header (localized: NAME STATE VERSION, NAME STATUS VERSION, ...),
    then ``[*] NAME STATE VERSION`` rows aligned under it, the default distribution marked ``*``.
    States are localized and may be several words ("Wird ausgeführt"): the header's column
    positions cut the rows; without a usable header, the last two words are state and version."""
    lines = [line for line in body.splitlines() if line.strip()]
    columns: list[int] = []
    for line in lines:
        if not line.lstrip().startswith("*") and not line.split()[-1].isdigit():
            starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", line)]
            if len(starts) == 3:
                columns = starts
            break
    distros = []
    for line in lines:
        default = line.lstrip().startswith("*")
        cells = line.split()
        if len(cells) < 3 or not cells[-1].isdigit():
            continue  # the header, or a message ("no installed distributions")
        row = line.replace("*", " ", 1) if default else line
        if columns and len(row) > columns[2]:
            name = row[: columns[1]].strip()
            state = row[columns[1] :].rsplit(None, 1)[0].strip()
        else:
            words = row.split()
            name, state = " ".join(words[:-2]), words[-2]
        distros.append(WslDistro(name=name, state=state, version=int(cells[-1]), default=default))
    return tuple(distros)


def parse_wsl_status(body: str) -> int | None:
    """``wsl --status`` -> the default WSL version for new distributions (a line ending in 1 or 2)."""
    for line in body.splitlines():
        match = re.search(r":\s*([12])\s*$", line)
        if match:
            return int(match.group(1))
    return None


def parse_wslconfig(text: str) -> str:
    """``networkingMode`` from ``.wslconfig`` (lowercased): ``[wsl2]`` (WSL 2.0.5+), else the
    ``[experimental]`` section where WSL 2.0.0 read it; ``nat`` when unset. Keys are
    case-insensitive, ``#`` and ``;`` start comments."""
    section = ""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and "]" in line:
            section = line[1 : line.index("]")].strip().lower()
            continue
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "networkingmode":
            value = re.split(r"\s[#;]", value, maxsplit=1)[0].strip().strip("\"'").lower()
            found.setdefault(section, value)
    return found.get("wsl2") or found.get("experimental") or "nat"


class Wsl(Fact[WslInfo]):
    """WSL on the node: ``wsl.exe --version``, ``--status``, ``--list --verbose`` and ``.wslconfig``.

    Distributions are per Windows user: this is what the WinRM account sees, which is the account
    that will run training."""

    name = "wsl"

    def command(self, platform: Platform) -> str:
        wsl = _ps(platform).quote("C:\\Windows\\System32\\wsl.exe")
        return (
            f"$cbWslExe = {wsl}\n"
            "if (-not (Test-Path -LiteralPath $cbWslExe)) {\n"
            "  $cbWslExe = $env:SystemRoot + '\\System32\\wsl.exe'\n"
            "}\n"
            "if (-not (Test-Path -LiteralPath $cbWslExe)) {\n"
            "  [Console]::Out.WriteLine('--- missing')\n"
            "  return\n"
            "}\n"
            f"{WSL_DECODER}\n"
            "Invoke-CbWsl 'version' '--version'\n"
            "Invoke-CbWsl 'status' '--status'\n"
            "Invoke-CbWsl 'list' '--list --verbose'\n"
            "$cbConfig = Join-Path -Path $env:USERPROFILE -ChildPath '.wslconfig'\n"
            "if (Test-Path -LiteralPath $cbConfig) {\n"
            "  [Console]::Out.WriteLine('--- wslconfig exit=0')\n"
            "  [Console]::Out.WriteLine([System.IO.File]::ReadAllText($cbConfig))\n"
            "} else {\n"
            "  [Console]::Out.WriteLine('--- wslconfig exit=missing')\n"
            "}"
        )

    def parse(self, output: str, exit_code: int) -> WslInfo:
        blocks = _blocks(output)
        if "missing" in blocks:
            return WslInfo(installed=False, error="wsl.exe is not on this machine")
        if not blocks:
            raise FactParseError(f"no wsl.exe output (exit code {exit_code})")
        version_code, version_body = blocks.get("version", ("", ""))
        _, status_body = blocks.get("status", ("", ""))
        list_code, list_body = blocks.get("list", ("", ""))
        config_code, config_body = blocks.get("wslconfig", ("missing", ""))
        version, kernel = parse_wsl_version(version_body) if version_code == "0" else (None, None)
        distros = parse_wsl_list(list_body)
        default_version = parse_wsl_status(status_body)
        error = None
        installed = True
        if not distros and list_code != "0":
            # "no installed distributions", "not installed", "cannot be accessed": wsl.exe's first words
            first = next((line.strip() for line in list_body.splitlines() if line.strip()), None)
            error = first or f"wsl --list failed (exit {list_code})"
            if version is None and default_version is None:
                installed = _says_installed(list_body + "\n" + status_body)
        return WslInfo(
            installed=installed,
            version=version,
            kernel=kernel,
            default_version=default_version,
            distros=distros,
            networking_mode=parse_wslconfig(config_body) if config_code == "0" else "nat",
            wslconfig=config_code == "0",
            error=error,
        )


def _says_installed(text: str) -> bool:
    """False when wsl.exe says WSL itself is missing ("... is not installed", Windows 10 without the
    optional component: "... optional component is not enabled")."""
    lowered = text.lower()
    return not any(words in lowered for words in ("is not installed", "is not enabled"))


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


class RunsWindows(Protocol):
    """A transport that can also run PowerShell on the Windows side of a WSL node (WinRMTransport)."""

    def run_windows(self, command: str, *, timeout: float | None = None) -> Result: ...


def gather_windows_side(transport: RunsWindows, facts: list[Fact[Any]], *, timeout: float = 120.0) -> FactSet:
    """The Windows-side facts of a WSL node (``windows``, ``wsl``, ``windows_python``) in one
    PowerShell round trip; the distribution's own facts are a second one, through wsl.exe
    (:func:`~orchestrator.facts.base.gather` on the node's WSL platform).

    Two round trips, not one script starting wsl.exe from PowerShell: the distribution's facts then
    travel exactly like every other command for that node (the ``wsl.exe ... -e /bin/sh -c`` line),
    and when WSL is broken the Windows side still answers and says why."""
    ps = PowerShell()
    token = "cb-" + secrets.token_hex(6)
    script = ps.sectioned([(f.name, f.command(ps)) for f in facts], token)
    result = transport.run_windows(script, timeout=timeout)
    return collect(facts, result, token)


# -- network: the route to the master, the adapters (native mode) ----------------------------------
#
# GLOO_SOCKET_IFNAME on Windows is the adapter's *friendly name* (what Get-NetAdapter shows as Name
# and Find-NetRoute / Get-NetIPAddress as InterfaceAlias: "Ethernet 2", "WLAN"), compared exactly, case
# included. Read in the sources: torch/csrc/distributed/c10d/GlooDeviceFactory.cpp registers
# makeUVDevice for WIN32, which sets gloo's uv ``attr.iface`` to the variable's value;
# gloo/transport/uv/device.cc ``lookupAddrForIface`` strcmp()s it with the names
# ``uv_interface_addresses`` returns and takes that adapter's *first* unicast address of any family
# (``attr.ai_family`` is AF_UNSPEC: it can be IPv6); libuv src/win/util.c ``uv_interface_addresses``
# names each entry after ``IP_ADAPTER_ADDRESSES.FriendlyName`` (UTF-16 converted to UTF-8) and skips
# adapters whose OperStatus is not IfOperStatusUp. So not the description ("Intel(R) Ethernet
# Controller I225-V") nor the GUID (AdapterName), and an adapter that is not up is not found at all
# ("Unable to find address for: <name>").

#: adapter Status values (Get-NetAdapter's Status property, computed from its numeric states in
#: Windows' NetAdapter type data, not localized) that libuv lists: only "Up"
ADAPTER_UP = "Up"
#: Get-NetIPAddress AddressState values of an address the adapter really holds
USABLE_ADDRESS_STATES = ("Preferred", "Deprecated")


@dataclass(frozen=True)
class WindowsAdapter:
    """A network adapter as ``Get-NetAdapter`` shows it."""

    name: str  # friendly name = InterfaceAlias: what GLOO_SOCKET_IFNAME must say
    index: int  # ifIndex
    status: str  # Up, Disconnected, Disabled, Not Present
    description: str = ""  # InterfaceDescription: the driver's name, not what gloo matches

    @property
    def up(self) -> bool:
        return self.status == ADAPTER_UP


@dataclass(frozen=True)
class WindowsNetwork:
    """Adapters and the addresses on every interface (also those Get-NetAdapter hides: loopback)."""

    adapters: tuple[WindowsAdapter, ...]
    addresses: tuple[InterfaceAddress, ...]  # usable IPv4 addresses, interface = InterfaceAlias
    ipv6: tuple[InterfaceAddress, ...] = ()  # IPv6 ones: gloo binds one if it comes first

    @property
    def interfaces(self) -> tuple[str, ...]:
        """Every interface name an inventory's ``interface:`` may give."""
        names = [a.name for a in self.adapters]
        names += [a.interface for a in (*self.addresses, *self.ipv6) if a.interface not in names]
        return tuple(dict.fromkeys(names))

    @property
    def down(self) -> tuple[str, ...]:
        """Adapters gloo cannot use: not up (libuv does not list them)."""
        return tuple(a.name for a in self.adapters if not a.up)

    def adapter(self, name: str) -> WindowsAdapter | None:
        return next((a for a in self.adapters if a.name == name), None)


@dataclass(frozen=True)
class WindowsRoute(Route):
    """A :class:`~orchestrator.facts.network.Route` that can also say why it is missing: PowerShell
    gives the exception's message (resolution, Find-NetRoute)."""

    why: str | None = None

    @property
    def detail(self) -> str | None:
        return self.why


class WindowsMasterRoute(Fact[Route]):
    """The route to the master on a native Windows node: the master's name resolved like the training
    processes will (``[System.Net.Dns]::GetHostAddresses``: hosts file, then DNS; first IPv4), then
    ``Find-NetRoute -RemoteIPAddress``, which gives the interface (InterfaceAlias, InterfaceIndex)
    and the source address Windows picks, as ``ip route get`` does on Linux."""

    name = "route"

    def __init__(self, master_host: str) -> None:
        self.master_host = master_host

    def command(self, platform: Platform) -> str:
        target = _ps(platform).quote(self.master_host)
        return (
            f"$cbTarget = {target}\n"
            "$cbAddress = ''\n"
            "try {\n"
            "  $cbFirst = [System.Net.Dns]::GetHostAddresses($cbTarget) |\n"
            "    Where-Object { $_.AddressFamily -eq [System.Net.Sockets.AddressFamily]::InterNetwork } |\n"
            "    Select-Object -First 1\n"
            "  if ($cbFirst) { $cbAddress = $cbFirst.IPAddressToString }\n"
            "} catch {\n"
            "  'resolve_error=' + $_.Exception.Message\n"
            "}\n"
            "'resolved=' + $cbAddress\n"
            "if (-not $cbAddress) { return }\n"
            "$cbMine = @(Get-NetIPAddress -AddressFamily IPv4 -IPAddress $cbAddress"
            " -ErrorAction SilentlyContinue)\n"
            "'local=' + ($cbMine.Count -gt 0)\n"
            "try {\n"
            "  $cbFound = @(Find-NetRoute -RemoteIPAddress $cbAddress)\n"
            "} catch {\n"
            "  'route_error=' + $_.Exception.Message\n"
            "  return\n"
            "}\n"
            # Find-NetRoute returns the source address (MSFT_NetIPAddress) and the route (MSFT_NetRoute)
            "$cbSource = $cbFound | Where-Object { $_.CimClass.CimClassName -eq 'MSFT_NetIPAddress' } |"
            " Select-Object -First 1\n"
            "$cbRoute = $cbFound | Where-Object { $_.CimClass.CimClassName -eq 'MSFT_NetRoute' } |"
            " Select-Object -First 1\n"
            "if ($cbSource) {\n"
            "  'source=' + $cbSource.IPAddress\n"
            "  'index=' + $cbSource.InterfaceIndex\n"
            "  'interface=' + $cbSource.InterfaceAlias\n"
            "}\n"
            "if ($cbRoute) {\n"
            "  'prefix=' + $cbRoute.DestinationPrefix\n"
            "  'nexthop=' + $cbRoute.NextHop\n"
            "  'route_interface=' + $cbRoute.InterfaceAlias\n"
            "}"
        )

    def parse(self, output: str, exit_code: int) -> Route:
        values = _key_values(output)
        if "resolved" not in values:
            raise FactParseError(f"no resolution line (exit code {exit_code})")
        address = values["resolved"] or None
        if address is None:
            why = values.get("resolve_error") or "no IPv4 address"
            return WindowsRoute(self.master_host, None, None, None, False, why=why)
        local = values.get("local", "").lower() == "true"
        interface = values.get("interface") or values.get("route_interface") or None
        source = values.get("source") or None
        detail: str | None = values.get("route_error")
        if detail is None and (interface is None or source is None):
            detail = "Find-NetRoute named no interface and source address"
        return WindowsRoute(self.master_host, address, interface, source, local, why=detail)


class WindowsAdapters(Fact[WindowsNetwork]):
    """``Get-NetAdapter`` (name, index, status, description) and ``Get-NetIPAddress`` (every address,
    loopback included), one ``key=fields`` line each; the name comes last since it may hold anything
    but a line break."""

    name = "adapters"

    def command(self, platform: Platform) -> str:
        return (
            "Get-NetAdapter | Sort-Object -Property ifIndex | ForEach-Object {\n"
            "  'adapter=' + $_.ifIndex + '|' + $_.Status + '|' + $_.Name\n"
            "  'description=' + $_.ifIndex + '|' + $_.InterfaceDescription\n"
            "}\n"
            "Get-NetIPAddress | Sort-Object -Property InterfaceIndex | ForEach-Object {\n"
            "  'address=' + $_.AddressFamily + '|' + $_.IPAddress + '|' + $_.PrefixLength + '|' +"
            " $_.AddressState + '|' + $_.InterfaceAlias\n"
            "}"
        )

    def parse(self, output: str, exit_code: int) -> WindowsNetwork:
        if exit_code != 0:
            raise FactParseError(f"Get-NetAdapter / Get-NetIPAddress failed (exit code {exit_code})")
        adapters: dict[int, WindowsAdapter] = {}
        descriptions: dict[int, str] = {}
        ipv4: list[InterfaceAddress] = []
        ipv6: list[InterfaceAddress] = []
        for line in output.replace("\r", "").split("\n"):
            key, sep, rest = line.partition("=")
            if not sep:
                continue
            if key == "adapter":
                index, status, name = rest.split("|", 2)
                adapters[int(index)] = WindowsAdapter(name=name, index=int(index), status=status)
            elif key == "description":
                index, description = rest.split("|", 1)
                descriptions[int(index)] = description
            elif key == "address":
                family, address, prefix, state, alias = rest.split("|", 4)
                if state not in USABLE_ADDRESS_STATES:
                    continue  # Tentative, Duplicate, Invalid: not an address peers can reach
                found = InterfaceAddress(alias, address, int(prefix or 0))
                (ipv6 if family == "IPv6" else ipv4).append(found)
        return WindowsNetwork(
            adapters=tuple(
                WindowsAdapter(a.name, a.index, a.status, descriptions.get(a.index, ""))
                for a in adapters.values()
            ),
            addresses=tuple(ipv4),
            ipv6=tuple(ipv6),
        )


def windows_network_facts(master_host: str) -> list[Fact[Any]]:
    """What the preflight needs from a native Windows node to choose GLOO_SOCKET_IFNAME."""
    return [WindowsMasterRoute(master_host), WindowsAdapters()]
