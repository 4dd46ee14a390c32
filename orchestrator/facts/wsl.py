"""Facts of WSL on a Windows node: installed or not, its version, the distributions of the WinRM
account (WSL 1 or 2, the default one), and the ``.wslconfig`` networking mode.

``wsl.exe`` writes UTF-16LE whatever the console code page (only ``WSL_UTF8=1`` changes that): the
command reads its raw bytes and decodes them (:data:`WSL_DECODER`), and the parsers drop the NULs of a
UTF-16 text that was read as bytes anyway (:func:`decode_wsl_text`). Which modes a node can run,
from these facts, is :func:`orchestrator.facts.windows.windows_modes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.facts.base import Fact, FactParseError
from orchestrator.facts.windows_base import powershell_of
from orchestrator.platforms import Platform

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
        wsl = powershell_of(platform).quote("C:\\Windows\\System32\\wsl.exe")
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
