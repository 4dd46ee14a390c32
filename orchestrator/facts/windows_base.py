"""What the Windows facts share (facts/windows.py, facts/wsl.py, facts/windows_network.py): the
PowerShell dialect their commands are written in, and the ``key=value`` lines many of them print.
"""

from __future__ import annotations

from orchestrator.facts.base import FactParseError
from orchestrator.platforms import Platform
from orchestrator.platforms.powershell import PowerShell


def powershell_of(platform: Platform) -> PowerShell:
    """The dialect a Windows fact's command is written in: the platform itself, or the Windows side
    of a WSL node's platform."""
    own = platform.as_powershell() or platform.host_shell.as_powershell()
    if own is not None:
        return own
    raise FactParseError(f"Windows facts need PowerShell, not {platform.name}")


def key_values(output: str) -> dict[str, str]:
    """``key=value`` lines -> {key: value}, both stripped (other lines are ignored)."""
    values: dict[str, str] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    return values
